"""GPT-J (`GPTJForCausalLM`): a parallel block (attention and a plain GELU MLP read the same
LayerNorm output), interleaved rotary on the first `rotary_dim` features of each head, no
attention biases, biases on the MLP and the LM head, untied embeddings.

Checkpoint names: transformer.wte, transformer.h.{i}.ln_1, .attn.{q,k,v,out}_proj, .mlp.fc_in /
.fc_out, transformer.ln_f, lm_head (old checkpoints also hold the attention's mask buffers).
"""

from __future__ import annotations

from pytgi.models.base import CausalLM
from pytgi.models.config import (
    PARALLEL,
    DecoderSpec,
    Norm,
    attention_fields,
    common_fields,
    require,
)
from pytgi.models.decoder import QKV_PACKED_MODULES, DecoderForCausalLM


class GPTJForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = QKV_PACKED_MODULES
    weight_renames = (
        (r"^transformer\.wte\.", "model.embed_tokens."),
        (r"^transformer\.ln_f\.", "model.norm."),
        (r"^transformer\.h\.", "model.layers."),
        (r"\.ln_1\.", ".input_layernorm."),
        (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
        (r"\.attn\.(q|k|v)_proj\.", r".self_attn.\1_proj."),
        (r"\.mlp\.fc_in\.", ".mlp.up_proj."),
        (r"\.mlp\.fc_out\.", ".mlp.down_proj."),
    )
    ignored_weights = (*CausalLM.ignored_weights, r"\.attn\.(masked_)?bias$")

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        common = common_fields(hf_config, architecture)
        attention = attention_fields(hf_config)
        return DecoderSpec(
            **common,
            **attention,
            intermediate_size=getattr(hf_config, "n_inner", None) or 4 * common["hidden_size"],
            norm_eps=require(hf_config, "layer_norm_epsilon"),
            norm=Norm.LAYER,
            norm_bias=True,
            block=PARALLEL,
            hidden_act=require(hf_config, "activation_function"),
            mlp_gated=False,
            rotary_dim=getattr(hf_config, "rotary_dim", None),
            rotary_interleaved=True,
            mlp_bias=True,
            lm_head_bias=True,
            **flags,
        )
