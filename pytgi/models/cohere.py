"""Command-R (`CohereForCausalLM`): a parallel block (attention and the gated SiLU MLP read the
same norm), LayerNorm without bias, interleaved rotary (feature 2i pairs with 2i + 1), logits
multiplied by `logit_scale`, tied embeddings. Checkpoint names are Llama's (no
post_attention_layernorm). The per-head q/k LayerNorm of `use_qk_norm` (Command R+) is refused.
"""

from __future__ import annotations

from pytgi.errors import ModelLoadError
from pytgi.models.config import (
    PARALLEL,
    DecoderSpec,
    Norm,
    attention_fields,
    common_fields,
    require,
    rope_scaling,
)
from pytgi.models.decoder import DecoderForCausalLM


class CohereForCausalLM(DecoderForCausalLM):
    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        if getattr(hf_config, "use_qk_norm", False):
            raise ModelLoadError("CohereForCausalLM with use_qk_norm is not supported")
        bias = bool(getattr(hf_config, "attention_bias", False))
        return DecoderSpec(
            **common_fields(hf_config, architecture),
            **attention_fields(hf_config),
            intermediate_size=require(hf_config, "intermediate_size"),
            norm_eps=require(hf_config, "layer_norm_eps"),
            norm=Norm.LAYER,
            block=PARALLEL,
            hidden_act=require(hf_config, "hidden_act"),
            rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
            rope_scaling=rope_scaling(hf_config),
            rotary_interleaved=True,
            logit_scale=float(getattr(hf_config, "logit_scale", 1.0)),
            qkv_bias=bias,
            o_bias=bias,
            **flags,
        )
