"""Phi-3, Phi-3.5 and Phi-4-mini (`Phi3ForCausalLM`): Llama's blocks with the checkpoint's own
fused tensors (`qkv_proj` as [q | k | v], `gate_up_proj` as [gate | up]), optional partial
rotary, a sliding window on every layer (the 4k models) and LongRoPE scaling ("su" / "longrope":
short and long per-frequency factors around original_max_position_embeddings, see
layers/rotary.py).
"""

from __future__ import annotations

import dataclasses

from pytgi.models.config import DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    packed_modules_mapping = {}  # qkv_proj and gate_up_proj are fused in the checkpoint already

    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        spec = decoder_spec_from_hf(hf_config, architecture, flags)
        scaling = spec.rope_scaling
        if scaling is None:
            return spec
        scaling = dict(scaling)
        if scaling["rope_type"] == "su":  # Phi-3's first name for LongRoPE
            scaling["rope_type"] = "longrope"
        original = getattr(hf_config, "original_max_position_embeddings", None)
        if original and scaling["rope_type"] == "longrope":
            scaling.setdefault("original_max_position_embeddings", original)
        return dataclasses.replace(spec, rope_scaling=scaling)
