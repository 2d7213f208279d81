"""Llama-family causal LM: Llama 2/3/3.x, CodeLlama, Mistral, Qwen2, Qwen3 and Granite (registry
aliases with flags on `DecoderSpec`). Parameter names follow the HF checkpoints except the fused
`qkv_proj` and `gate_up_proj` (see `packed_modules_mapping`).
"""

from __future__ import annotations

from pytgi.models.config import DecoderSpec, decoder_spec_from_hf
from pytgi.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def spec_from_hf(cls, hf_config, architecture: str, flags: dict) -> DecoderSpec:
        return decoder_spec_from_hf(hf_config, architecture, flags)
