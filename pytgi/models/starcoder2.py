"""StarCoder2 (`Starcoder2ForCausalLM`): Llama's attention with biases (`use_bias`), LayerNorm with
bias, a plain tanh-GELU MLP (`c_fc`, `c_proj`), an optional sliding window, tied embeddings.
"""

from __future__ import annotations

from pytgi.models.config import (
    DecoderSpec,
    Norm,
    attention_fields,
    common_fields,
    require,
    rope_scaling,
    sliding_windows,
)
from pytgi.models.decoder import QKV_PACKED_MODULES, DecoderForCausalLM


class Starcoder2ForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = QKV_PACKED_MODULES
    weight_renames = ((r"\.mlp\.c_fc\.", ".mlp.up_proj."), (r"\.mlp\.c_proj\.", ".mlp.down_proj."))

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        common = common_fields(hf_config, architecture)
        bias = bool(getattr(hf_config, "use_bias", True))
        return DecoderSpec(
            **common,
            **attention_fields(hf_config),
            intermediate_size=require(hf_config, "intermediate_size"),
            norm_eps=require(hf_config, "norm_epsilon"),
            norm=Norm.LAYER,
            norm_bias=True,
            hidden_act=require(hf_config, "hidden_act"),
            mlp_gated=False,
            rope_theta=float(getattr(hf_config, "rope_theta", 10000.0)),
            rope_scaling=rope_scaling(hf_config),
            sliding_windows=sliding_windows(hf_config, common["num_layers"]),
            qkv_bias=bias,
            o_bias=bias,
            mlp_bias=bias,
            **flags,
        )
