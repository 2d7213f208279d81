"""HF `architectures` name -> model class, imported lazily, plus the flags of architecture aliases.

A model that differs from Llama only by a flag is an entry here, not a new file.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from pytgi.errors import ModelLoadError


@dataclass(frozen=True)
class ModelEntry:
    module: str  # under pytgi.models
    class_name: str
    flags: dict = field(default_factory=dict)  # ModelSpec overrides


_MODELS: dict[str, ModelEntry] = {
    "LlamaForCausalLM": ModelEntry("llama", "LlamaForCausalLM"),  # Llama 2/3/3.x, CodeLlama
    "MistralForCausalLM": ModelEntry("llama", "LlamaForCausalLM"),  # sliding window from config
    "Qwen2ForCausalLM": ModelEntry(
        "llama", "LlamaForCausalLM", {"qkv_bias": True, "o_bias": False}
    ),
    "Qwen3ForCausalLM": ModelEntry("llama", "LlamaForCausalLM", {"qk_norm": True}),
    "GraniteForCausalLM": ModelEntry("llama", "LlamaForCausalLM"),  # multipliers from config
    "PhiForCausalLM": ModelEntry("phi", "PhiForCausalLM"),  # Phi-1, 1.5, 2
    "Phi3ForCausalLM": ModelEntry("phi3", "Phi3ForCausalLM"),  # Phi-3, 3.5, 4-mini
    "GemmaForCausalLM": ModelEntry("gemma", "GemmaForCausalLM"),
    "Gemma2ForCausalLM": ModelEntry("gemma", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ModelEntry("gemma", "Gemma3ForCausalLM"),  # text-only checkpoints
    "CohereForCausalLM": ModelEntry("cohere", "CohereForCausalLM"),  # Command-R
    "Starcoder2ForCausalLM": ModelEntry("starcoder2", "Starcoder2ForCausalLM"),
    "FalconForCausalLM": ModelEntry("falcon", "FalconForCausalLM"),
    "GPT2LMHeadModel": ModelEntry("gpt2", "GPT2LMHeadModel"),
    "GPTBigCodeForCausalLM": ModelEntry("gpt2", "GPTBigCodeForCausalLM"),  # StarCoder 1
    "GPTJForCausalLM": ModelEntry("gptj", "GPTJForCausalLM"),
    "BaichuanForCausalLM": ModelEntry("baichuan", "BaichuanForCausalLM"),  # 13B: ALiBi
    "BaiChuanForCausalLM": ModelEntry("baichuan", "BaichuanForCausalLM"),  # Baichuan-7B
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_architecture(architectures: list[str] | None) -> tuple[str, ModelEntry]:
    """The first of the config's `architectures` that pytgi implements."""
    for name in architectures or []:
        if name in _MODELS:
            return name, _MODELS[name]
    raise ModelLoadError(
        f"unsupported model architecture {architectures or '(none in config.json)'}; "
        f"supported: {', '.join(supported_architectures())}"
    )


def get_model_class(entry: ModelEntry) -> type:
    module = importlib.import_module(f"pytgi.models.{entry.module}")
    return getattr(module, entry.class_name)
