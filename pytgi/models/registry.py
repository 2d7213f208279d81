"""HF `architectures` name -> model class, imported lazily, plus the flags of architecture aliases.

A model that differs from Llama only by a flag is an entry here, not a new file. An architecture
with no entry here but in transformers' causal-LM table (or, with --trust-remote-code, one whose
config maps AutoModelForCausalLM to the checkpoint's own code) resolves to the transformers
fallback (models/transformers_fallback.py). Nothing here imports torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace

from pytgi.config import MODEL_IMPLEMENTATIONS
from pytgi.errors import ModelLoadError
from pytgi.models.causal_lm_table import is_transformers_causal_lm

NATIVE = "native"
TRANSFORMERS = "transformers"


@dataclass(frozen=True)
class ModelEntry:
    module: str  # under pytgi.models
    class_name: str
    flags: dict = field(default_factory=dict)  # ModelSpec overrides
    implementation: str = NATIVE  # or TRANSFORMERS: transformers' modeling code on pytgi's cache


TRANSFORMERS_FALLBACK = ModelEntry(
    "transformers_fallback", "TransformersCausalLM", implementation=TRANSFORMERS
)


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
    "MixtralForCausalLM": ModelEntry("moe_families", "MixtralForCausalLM"),
    "Qwen2MoeForCausalLM": ModelEntry("moe_families", "QwenMoeForCausalLM", {"o_bias": False}),
    "Qwen3MoeForCausalLM": ModelEntry("moe_families", "QwenMoeForCausalLM", {"qk_norm": True}),
    "PhimoeForCausalLM": ModelEntry("moe_families", "PhimoeForCausalLM"),  # Phi-3.5-MoE
    "DbrxForCausalLM": ModelEntry("moe_families", "DbrxForCausalLM"),
    "DeepseekV2ForCausalLM": ModelEntry("deepseek", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ModelEntry("deepseek", "DeepseekV3ForCausalLM"),
    "Llama4ForCausalLM": ModelEntry("llama4", "Llama4ForCausalLM"),  # text-only checkpoints
    "BaichuanForCausalLM": ModelEntry("baichuan", "BaichuanForCausalLM"),  # 13B: ALiBi
    "BaiChuanForCausalLM": ModelEntry("baichuan", "BaichuanForCausalLM"),  # Baichuan-7B
    # vision-language models (models/multimodal.py)
    "Qwen2VLForConditionalGeneration": ModelEntry("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    "Qwen2_5_VLForConditionalGeneration": ModelEntry(
        "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"
    ),
    "Idefics2ForConditionalGeneration": ModelEntry("idefics2", "Idefics2ForConditionalGeneration"),
    "Idefics3ForConditionalGeneration": ModelEntry("idefics3", "Idefics3ForConditionalGeneration"),
    "LlavaNextForConditionalGeneration": ModelEntry(
        "llava_next", "LlavaNextForConditionalGeneration"
    ),
    "PaliGemmaForConditionalGeneration": ModelEntry(
        "paligemma", "PaliGemmaForConditionalGeneration"
    ),
    "Gemma3ForConditionalGeneration": ModelEntry("gemma3_vlm", "Gemma3ForConditionalGeneration"),
    "Llama4ForConditionalGeneration": ModelEntry("llama4", "Llama4ForConditionalGeneration"),
    "MllamaForConditionalGeneration": ModelEntry("mllama", "MllamaForConditionalGeneration"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def resolve_architecture(
    architectures: list[str] | None,
    implementation: str = "auto",
    remote_code: bool = False,
) -> tuple[str, ModelEntry]:
    """The first of the config's `architectures` that pytgi implements natively, else the first
    the transformers fallback can build (`implementation="transformers"` skips the native ones;
    `remote_code`: --trust-remote-code is set and the config maps AutoModelForCausalLM to the
    checkpoint's own code)."""
    names = architectures or []
    assert implementation in MODEL_IMPLEMENTATIONS, implementation  # checked by ModelConfig
    if implementation == "auto":
        for name in names:
            if name in _MODELS:
                return name, _MODELS[name]
    for name in names:
        if is_transformers_causal_lm(name):
            return name, TRANSFORMERS_FALLBACK
    if names and remote_code:
        return names[0], replace(TRANSFORMERS_FALLBACK, flags={"trust_remote_code": True})
    raise ModelLoadError(
        f"unsupported model architecture {names or '(none in config.json)'}: pytgi implements "
        f"{', '.join(supported_architectures())} natively and runs any other causal LM of "
        "transformers' table through its transformers fallback"
    )


def get_model_class(entry: ModelEntry) -> type:
    module = importlib.import_module(f"pytgi.models.{entry.module}")
    return getattr(module, entry.class_name)
