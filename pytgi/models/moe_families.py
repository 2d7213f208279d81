"""Mixture-of-experts families on the shared decoder blocks: Llama's attention and norms with a
sparse MoE MLP (layers/moe) in place of the dense one.

- Mixtral (`MixtralForCausalLM`): every layer sparse; softmax top-k renormalised; experts'
  w1/w3/w2 tensors under `block_sparse_moe`; Mistral's sliding window from the config.
- Qwen2-MoE (`Qwen2MoeForCausalLM`): softmax top-k renormalised only with `norm_topk_prob`,
  plus a shared expert scaled by sigmoid(shared_expert_gate(x)); q/k/v biases; sparse layers
  every `decoder_sparse_step` except `mlp_only_layers` (those run a dense MLP).
- Qwen3-MoE (`Qwen3MoeForCausalLM`): Qwen2-MoE's routing without a shared expert, Qwen3's
  per-head q/k RMSNorm and explicit head_dim.
"""

from __future__ import annotations

import dataclasses

from pytgi.layers.moe.config import MoEConfig
from pytgi.models.config import DecoderSpec, decoder_spec_from_hf, require
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
    expert_names = ("gate_proj", "up_proj", "down_proj")

    def expert_weight_mapping(self):
        return expert_mapping(self.spec.moe.num_experts, self.expert_names)


class MixtralForCausalLM(MoEDecoderForCausalLM):
    weight_renames = ((r"\.block_sparse_moe\.", ".mlp."),)
    expert_names = ("w1", "w3", "w2")

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
