"""GPT-2 (`GPT2LMHeadModel`) and GPT-BigCode / StarCoder 1 / SantaCoder (`GPTBigCodeForCausalLM`):
learned absolute positions (`wpe`), LayerNorm with bias, a plain GELU MLP, biases everywhere, tied
embeddings, attention scaled by 1/sqrt(head_dim) (or not at all without `scale_attn_weights`).

GPT-2 stores its linears as Conv1D weights [in, out] (transposed on load) with q/k/v as one
[q | k | v] tensor (`c_attn`); hub checkpoints name tensors with or without the `transformer.`
prefix. GPT-BigCode stores plain [out, in] weights and multi-query attention (one KV head, `c_attn`
= [q | k | v]); without `multi_query`, `c_attn` is grouped per head as [q | k | v].
"""

from __future__ import annotations

from pytgi.errors import ModelLoadError
from pytgi.models.base import CausalLM
from pytgi.models.config import LEARNED, DecoderSpec, Norm, QkvLayout, common_fields, require
from pytgi.models.decoder import DecoderForCausalLM

_LAYER = r"^h\.(\d+)\."


class GPT2LMHeadModel(DecoderForCausalLM):
    packed_modules_mapping = {}  # c_attn is one tensor
    weight_renames = (
        (r"^transformer\.", ""),
        (r"^wte\.", "model.embed_tokens."),
        (r"^wpe\.", "model.embed_positions."),
        (r"^ln_f\.", "model.norm."),
        (_LAYER + r"ln_1\.", r"model.layers.\1.input_layernorm."),
        (_LAYER + r"ln_2\.", r"model.layers.\1.post_attention_layernorm."),
        (_LAYER + r"attn\.c_attn\.", r"model.layers.\1.self_attn.qkv_proj."),
        (_LAYER + r"attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
        (_LAYER + r"mlp\.c_fc\.", r"model.layers.\1.mlp.up_proj."),
        (_LAYER + r"mlp\.c_proj\.", r"model.layers.\1.mlp.down_proj."),
    )
    transposed_weights = (
        r"^model\.layers\.\d+\.(self_attn\.(qkv|o)_proj|mlp\.(up|down)_proj)\.weight$",
    )
    # the causal-mask buffers old checkpoints saved
    ignored_weights = (*CausalLM.ignored_weights, r"\.attn\.(masked_)?bias$")

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
            raise ModelLoadError(
                f"{architecture} with scale_attn_by_inverse_layer_idx is not supported"
            )
        common = common_fields(hf_config, architecture)
        num_heads = require(hf_config, "num_attention_heads")
        head_dim = common["hidden_size"] // num_heads
        scaled = getattr(hf_config, "scale_attn_weights", True)
        return DecoderSpec(
            **common,
            intermediate_size=getattr(hf_config, "n_inner", None) or 4 * common["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=cls.num_kv_heads(hf_config, num_heads),
            head_dim=head_dim,
            attention_scale=head_dim**-0.5 if scaled else 1.0,
            norm_eps=require(hf_config, "layer_norm_epsilon"),
            norm=Norm.LAYER,
            norm_bias=True,
            hidden_act=require(hf_config, "activation_function"),
            mlp_gated=False,
            position_encoding=LEARNED,
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            qkv_checkpoint_layout=cls.qkv_layout(hf_config),
            **flags,
        )

    @staticmethod
    def num_kv_heads(hf_config, num_heads: int) -> int:
        return num_heads

    @staticmethod
    def qkv_layout(hf_config) -> QkvLayout:
        return QkvLayout.CONCAT


class GPTBigCodeForCausalLM(GPT2LMHeadModel):
    transposed_weights = ()  # nn.Linear, not Conv1D

    @staticmethod
    def num_kv_heads(hf_config, num_heads: int) -> int:
        return 1 if getattr(hf_config, "multi_query", True) else num_heads

    @staticmethod
    def qkv_layout(hf_config) -> QkvLayout:
        return QkvLayout.CONCAT if getattr(hf_config, "multi_query", True) else QkvLayout.GROUPED
