"""Gemma, Gemma 2 and Gemma 3 text (`GemmaForCausalLM`, `Gemma2ForCausalLM`,
`Gemma3ForCausalLM`): RMSNorm scaling by (1 + w), embeddings scaled by sqrt(hidden_size), a gated
tanh-GELU MLP, tied embeddings. Gemma 2 adds pre- and post-norms around attention and MLP (a
sandwich block), attention-logit and final-logit soft-capping, a query scale of
query_pre_attn_scalar ** -0.5 and sliding-window layers alternating with global ones; Gemma 3
drops the attention soft-cap (transformers ignores it too), adds per-head q/k norms and gives its
sliding-window (local) layers their own rotary base without scaling.

Checkpoint names are Llama's plus the sandwich's pre_feedforward_layernorm and
post_feedforward_layernorm (post_attention_layernorm is the post-norm of attention here).
"""

from __future__ import annotations

import torch

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.base import QuantConfig
from pytgi.models.config import (
    SANDWICH,
    DecoderSpec,
    attention_fields,
    common_fields,
    require,
    rope_scaling,
    sliding_windows,
)
from pytgi.models.decoder import DecoderForCausalLM


def gemma_fields(hf_config, architecture: str, activation: str) -> dict:
    """What every Gemma generation shares."""
    common = common_fields(hf_config, architecture)
    return dict(
        **common,
        **attention_fields(hf_config),
        intermediate_size=require(hf_config, "intermediate_size"),
        norm_eps=require(hf_config, "rms_norm_eps"),
        norm_weight_offset=1.0,
        embedding_multiplier=common["hidden_size"] ** 0.5,
        hidden_act=require(hf_config, activation),
        rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
        rope_scaling=rope_scaling(hf_config),
        qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
        o_bias=bool(getattr(hf_config, "attention_bias", False)),
    )


class GemmaForCausalLM(DecoderForCausalLM):
    activation = "hidden_act"  # Gemma 1 reads hidden_act (transformers and TGI alike)

    def __init__(self, spec: DecoderSpec, quant_config: QuantConfig | None = None):
        super().__init__(spec, quant_config)
        # transformers multiplies by sqrt(hidden_size) rounded to the model's dtype
        normalizer = torch.tensor(spec.embedding_multiplier, dtype=torch.get_default_dtype())
        self.model.embedding_multiplier = float(normalizer)

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        return DecoderSpec(**gemma_fields(hf_config, architecture, cls.activation), **flags)


class Gemma2ForCausalLM(GemmaForCausalLM):
    activation = "hidden_activation"

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        fields = gemma_fields(hf_config, architecture, cls.activation)
        fields |= dict(
            block=SANDWICH,
            attention_scale=require(hf_config, "query_pre_attn_scalar") ** -0.5,
            sliding_windows=sliding_windows(hf_config, fields["num_layers"]),
            final_logit_softcap=getattr(hf_config, "final_logit_softcapping", None),
        )
        return DecoderSpec(**fields, **cls.generation_fields(hf_config), **flags)

    @staticmethod
    def generation_fields(hf_config) -> dict:
        return dict(attn_logit_softcap=getattr(hf_config, "attn_logit_softcapping", None))


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    @staticmethod
    def generation_fields(hf_config) -> dict:
        if getattr(hf_config, "use_bidirectional_attention", False):
            raise ModelLoadError("Gemma 3 with use_bidirectional_attention is not a causal LM")
        return dict(
            qk_norm=True, local_rope_theta=float(require(hf_config, "rope_local_base_freq"))
        )
