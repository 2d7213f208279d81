"""Phi-1, Phi-1.5 and Phi-2 (`PhiForCausalLM`): a parallel block (attention and a plain GELU MLP
read the same LayerNorm output), partial rotary (the first `partial_rotary_factor` of each head),
biases everywhere including the LM head, and optionally a per-head LayerNorm on q and k.

Checkpoint names (transformers' layout): model.layers.{i}.self_attn.{q,k,v}_proj and .dense,
.mlp.fc1 / .fc2, .input_layernorm, .self_attn.{q,k}_layernorm; model.final_layernorm; lm_head.
"""

from __future__ import annotations

from pytgi.models.config import (
    PARALLEL,
    DecoderSpec,
    Norm,
    attention_fields,
    common_fields,
    require,
    rope_scaling,
)
from pytgi.models.decoder import QKV_PACKED_MODULES, DecoderForCausalLM


class PhiForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = QKV_PACKED_MODULES
    weight_renames = (
        (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
        (r"\.self_attn\.(q|k)_layernorm\.", r".self_attn.\1_norm."),
        (r"\.mlp\.fc1\.", ".mlp.up_proj."),
        (r"\.mlp\.fc2\.", ".mlp.down_proj."),
        (r"^model\.final_layernorm\.", "model.norm."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        attention = attention_fields(hf_config)
        partial = getattr(hf_config, "partial_rotary_factor", 1.0)
        return DecoderSpec(
            **common_fields(hf_config, architecture),
            **attention,
            intermediate_size=require(hf_config, "intermediate_size"),
            norm_eps=require(hf_config, "layer_norm_eps"),
            norm=Norm.LAYER,
            norm_bias=True,
            block=PARALLEL,
            hidden_act=require(hf_config, "hidden_act"),
            mlp_gated=False,
            rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
            rope_scaling=rope_scaling(hf_config),
            rotary_dim=None if partial == 1.0 else int(attention["head_dim"] * partial),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            lm_head_bias=True,
            qk_norm=bool(getattr(hf_config, "qk_layernorm", False)),
            **flags,
        )
