"""Mixture-of-experts families on the shared decoder blocks: Llama's attention and norms with a
sparse MoE MLP (layers/moe) in place of the dense one.

- Mixtral (`MixtralForCausalLM`): every layer sparse; softmax top-k renormalised; experts'
  w1/w3/w2 tensors under `block_sparse_moe`; Mistral's sliding window from the config.
- Qwen2-MoE (`Qwen2MoeForCausalLM`): softmax top-k renormalised only with `norm_topk_prob`,
  plus a shared expert scaled by sigmoid(shared_expert_gate(x)); q/k/v biases; sparse layers
  every `decoder_sparse_step` except `mlp_only_layers` (those run a dense MLP).
- Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen2-MoE's routing without a shared expert, Qwen3's
  per-head q/k RMSNorm and explicit head_dim.
- PhiMoE (`PhimoeForCausalLM`, Phi-3.5-MoE): Mixtral's layout with LayerNorms (weight and bias),
  attention and LM-head biases, and the sparsemixer top-2 router (`router_jitter_noise` its
  epsilon); LongRoPE's short/long mscale as the rotary attention factor.
- DBRX (`DbrxForCausalLM`): its own names (`transformer.blocks.{i}.norm_attn_norm...`), a fused
  `Wqkv` clamped to +-clip_qkv, bias-free LayerNorms, softmax top-k divided by the weights'
  p-norm (`moe_normalize_expert_weights`), experts stacked in three [E * I, hidden] tensors
  (`w1` gate, `v1` up, `w2` down transposed).
"""

from __future__ import annotations

import dataclasses

from pytgi.errors import ModelLoadError
from pytgi.layers.moe.block import experts_quantized
from pytgi.layers.moe.config import SPARSEMIXER, MoEConfig
from pytgi.models.config import (
    DecoderSpec,
    attention_fields,
    common_fields,
    decoder_spec_from_hf,
    require,
)
from pytgi.models.decoder import DecoderForCausalLM


def expert_mapping(
    num_experts: int, names: tuple[str, str, str], prefix: str = "mlp.experts."
) -> list[tuple[str, str, int, str]]:
    """WeightMapper rows for per-expert checkpoint tensors named `{prefix}{e}.{name}.`: the
    gate, up and down names in `names`."""
    gate, up, down = names
    rows = []
    for e in range(num_experts):
        rows += [
            (f"{prefix}w13_", f"{prefix}{e}.{gate}.", e, "w1"),
            (f"{prefix}w13_", f"{prefix}{e}.{up}.", e, "w3"),
            (f"{prefix}w2_", f"{prefix}{e}.{down}.", e, "w2"),
        ]
    return rows


def qwen_sparse_layers(hf_config, num_layers: int) -> tuple[bool, ...]:
    step = getattr(hf_config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers))


class MoEDecoderForCausalLM(DecoderForCausalLM):
    """Per-expert checkpoint tensors (`mlp.experts.{e}.gate_proj` / `up_proj` / `down_proj`)
    load into the stacked experts through `expert_weight_mapping`; under a `--quantize` method
    each expert is its own pair of quantized linears, loaded by their names (no expert rows)."""

    def __init__(self, spec: DecoderSpec, quant_config=None):
        super().__init__(spec, quant_config)
        self.stacked_experts = not experts_quantized(quant_config)

    def expert_weight_mapping(self):
        if not self.stacked_experts:
            return []
        return expert_mapping(self.spec.moe.num_experts, ("gate_proj", "up_proj", "down_proj"))


class MixtralForCausalLM(MoEDecoderForCausalLM):
    weight_renames = (
        (r"\.block_sparse_moe\.", ".mlp."),
        (r"(\.experts\.\d+\.)w1\.", r"\1gate_proj."),
        (r"(\.experts\.\d+\.)w3\.", r"\1up_proj."),
        (r"(\.experts\.\d+\.)w2\.", r"\1down_proj."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        spec = decoder_spec_from_hf(hf_config, architecture, flags)
        moe = MoEConfig(
            num_experts=require(hf_config, "num_local_experts"),
            top_k=require(hf_config, "num_experts_per_tok"),
            intermediate_size=spec.intermediate_size,
            hidden_act=spec.hidden_act,
        )
        return dataclasses.replace(spec, moe=moe)


class QwenMoeForCausalLM(MoEDecoderForCausalLM):
    weight_renames = ((r"\.mlp\.shared_expert\.", ".mlp.shared_experts."),)

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        spec = decoder_spec_from_hf(hf_config, architecture, flags)
        if not getattr(hf_config, "use_sliding_window", False):
            spec = dataclasses.replace(spec, sliding_windows=())
        qkv_bias = bool(getattr(hf_config, "qkv_bias", spec.qkv_bias))
        shared = getattr(hf_config, "shared_expert_intermediate_size", 0) or 0
        moe = MoEConfig(
            num_experts=require(hf_config, "num_experts"),
            top_k=require(hf_config, "num_experts_per_tok"),
            intermediate_size=require(hf_config, "moe_intermediate_size"),
            hidden_act=spec.hidden_act,
            renormalize=bool(getattr(hf_config, "norm_topk_prob", False)),
            shared_intermediate_size=shared,
            shared_expert_gate=shared > 0,
            sparse_layers=qwen_sparse_layers(hf_config, spec.num_layers),
        )
        return dataclasses.replace(spec, moe=moe, qkv_bias=qkv_bias)


class PhimoeForCausalLM(MixtralForCausalLM):
    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        spec = super().spec_from_hf(hf_config, architecture, flags)
        bias = bool(getattr(hf_config, "attention_bias", False))
        moe = dataclasses.replace(
            spec.moe,
            router=SPARSEMIXER,
            jitter_eps=float(getattr(hf_config, "router_jitter_noise", 0.0) or 0.0),
        )
        return dataclasses.replace(
            spec,
            moe=moe,
            norm="layer",
            norm_bias=True,
            qkv_bias=bias,
            o_bias=bias,
            lm_head_bias=bool(getattr(hf_config, "lm_head_bias", False)),
            rope_scaling=_phimoe_rope(spec.rope_scaling),
        )


def _phimoe_rope(scaling: dict | None) -> dict | None:
    """PhiMoE's LongRoPE: its short/long mscale replaces the computed attention factor."""
    if scaling is None or "short_mscale" not in scaling:
        return scaling
    short, long = scaling.get("short_mscale"), scaling.get("long_mscale", scaling["short_mscale"])
    if short != long:
        raise ModelLoadError(
            f"LongRoPE with short_mscale {short} != long_mscale {long} is not supported"
        )
    return {**scaling, "rope_type": "longrope", "attention_factor": float(short)}


_DBRX_BLOCK = r"^transformer\.blocks\.(\d+)\."


class DbrxForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = {}  # Wqkv is fused in the checkpoint already
    weight_renames = (
        (r"^transformer\.wte\.", "model.embed_tokens."),
        (r"^transformer\.norm_f\.", "model.norm."),
        (_DBRX_BLOCK + r"norm_attn_norm\.norm_1\.", r"model.layers.\1.input_layernorm."),
        (_DBRX_BLOCK + r"norm_attn_norm\.norm_2\.", r"model.layers.\1.post_attention_layernorm."),
        (_DBRX_BLOCK + r"norm_attn_norm\.attn\.Wqkv\.", r"model.layers.\1.self_attn.qkv_proj."),
        (_DBRX_BLOCK + r"norm_attn_norm\.attn\.out_proj\.", r"model.layers.\1.self_attn.o_proj."),
        (_DBRX_BLOCK + r"ffn\.router\.layer\.", r"model.layers.\1.mlp.gate."),
        (_DBRX_BLOCK + r"ffn\.", r"model.layers.\1.mlp."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        attn, ffn = hf_config.attn_config, hf_config.ffn_config
        num_heads = require(hf_config, "n_heads")
        hidden = require(hf_config, "d_model")
        config_view = type("DbrxAttention", (), {})()
        config_view.num_attention_heads, config_view.hidden_size = num_heads, hidden
        config_view.num_key_value_heads = attn.kv_n_heads
        p = ffn.moe_normalize_expert_weights
        moe = MoEConfig(
            num_experts=ffn.moe_num_experts,
            top_k=ffn.moe_top_k,
            intermediate_size=ffn.ffn_hidden_size,
            hidden_act=(ffn.ffn_act_fn or {}).get("name", "silu"),
            renormalize=p is not None,
            renormalize_p=float(p or 1.0),
            per_expert_checkpoint=False,
        )
        return DecoderSpec(
            **common_fields(hf_config, architecture),
            **attention_fields(config_view),
            intermediate_size=ffn.ffn_hidden_size,
            norm_eps=1e-5,  # torch's LayerNorm default, which DBRX's norms keep
            rope_theta=float(attn.rope_theta),
            hidden_act=moe.hidden_act,
            norm="layer",
            qkv_clip=attn.clip_qkv,
            moe=moe,
            **flags,
        )

    def expert_weight_mapping(self):
        return [
            ("experts.w13_weight", "experts.mlp.w1", None, "w1"),
            ("experts.w13_weight", "experts.mlp.v1", None, "w3"),
            ("experts.w2_weight", "experts.mlp.w2", None, "w2_t"),
        ]
