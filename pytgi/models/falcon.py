"""Falcon (`FalconForCausalLM`), the RW layouts of Falcon-7B/40B/180B and Falcon-RW:

- the old decoder architecture (7B): one LayerNorm shared by attention and MLP (parallel block),
  multi-query attention, or a sequential block with two norms when `parallel_attn` is off (RW);
- the new decoder architecture (40B, 180B): grouped KV heads and two LayerNorms (`ln_attn`,
  `ln_mlp`) read by attention and MLP in parallel (`num_ln_in_parallel_attn`, 2 by default);
- rotary positions, or ALiBi when `alibi` is set (Falcon-RW-1B), whose bias Falcon adds before its
  1/sqrt(head_dim) scaling (so the slopes are scaled by it);
- a plain GELU MLP (`dense_h_to_4h`, `dense_4h_to_h`), biases when `bias` is set, tied embeddings.

The checkpoint's `query_key_value` is one tensor grouped per KV head: [its query heads | k | v]
(old multi-query: one group of all heads; old without multi-query: one group per head).
"""

from __future__ import annotations

from pytgi.models.config import (
    ALIBI,
    PARALLEL,
    PARALLEL_TWO_NORMS,
    ROPE,
    SEQUENTIAL,
    DecoderSpec,
    Norm,
    QkvLayout,
    common_fields,
    require,
    rope_scaling,
)
from pytgi.models.decoder import DecoderForCausalLM


def falcon_block(hf_config) -> str:
    new = bool(getattr(hf_config, "new_decoder_architecture", False))
    two_norms = getattr(hf_config, "num_ln_in_parallel_attn", None) in (None, 2)
    if new and two_norms:
        return PARALLEL_TWO_NORMS
    return PARALLEL if new or getattr(hf_config, "parallel_attn", True) else SEQUENTIAL


class FalconForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = {}  # query_key_value is one tensor
    weight_renames = (
        (r"^transformer\.word_embeddings\.", "model.embed_tokens."),
        (r"^transformer\.ln_f\.", "model.norm."),
        (r"^transformer\.h\.", "model.layers."),
        (r"\.self_attention\.query_key_value\.", ".self_attn.qkv_proj."),
        (r"\.self_attention\.dense\.", ".self_attn.o_proj."),
        (r"\.mlp\.dense_h_to_4h\.", ".mlp.up_proj."),
        (r"\.mlp\.dense_4h_to_h\.", ".mlp.down_proj."),
        (r"\.ln_attn\.", ".input_layernorm."),
        (r"\.ln_mlp\.", ".mlp_layernorm."),
    )

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        num_heads = require(hf_config, "num_attention_heads")
        head_dim = require(hf_config, "hidden_size") // num_heads
        grouped = getattr(hf_config, "new_decoder_architecture", False) or not getattr(
            hf_config, "multi_query", True
        )
        bias = bool(getattr(hf_config, "bias", False))
        alibi = bool(getattr(hf_config, "alibi", False))
        return DecoderSpec(
            **common_fields(hf_config, architecture),
            intermediate_size=require(hf_config, "ffn_hidden_size"),
            num_heads=num_heads,
            num_kv_heads=require(hf_config, "num_kv_heads") if grouped else 1,
            head_dim=head_dim,
            attention_scale=head_dim**-0.5,
            norm_eps=require(hf_config, "layer_norm_epsilon"),
            norm=Norm.LAYER,
            norm_bias=True,
            block=falcon_block(hf_config),
            hidden_act=getattr(hf_config, "activation", "gelu"),
            mlp_gated=False,
            position_encoding=ALIBI if alibi else ROPE,
            alibi_slope_scale=head_dim**-0.5 if alibi else 1.0,
            rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
            rope_scaling=rope_scaling(hf_config),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            qkv_checkpoint_layout=QkvLayout.GROUPED,
            **flags,
        )
