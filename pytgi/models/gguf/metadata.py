"""The model config and the tokenizer description a GGUF file's metadata holds.

The renaming of GGUF keys to HF config / tokenizer fields is transformers' own table
(`transformers.integrations.ggml`, the one `load_gguf_checkpoint` applies), run on the reader this
package already opened, so the file's metadata is parsed once; tests check the result equals
`load_gguf_checkpoint`'s. Added here, where transformers' loader has nothing: the HF
`architectures`, rope scaling (`<arch>.rope.scaling.*`) and the end-of-generation token ids
(`tokenizer.ggml.eot_token_id` / `eom_token_id`), which llama.cpp stops on besides EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader

from pytgi.errors import ModelLoadError

# GGUF `general.architecture` -> the HF architecture pytgi serves it as
SUPPORTED_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
_REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads")


@dataclass(frozen=True)
class LlamaCppFields:
    """GGUF keys that transformers' tables leave out."""

    tokenizer_model: str | None  # tokenizer.ggml.model: "llama" (sentencepiece), "gpt2" (BPE)
    add_bos_token: bool | None  # tokenizer.ggml.add_bos_token
    add_eos_token: bool | None
    eot_token_id: int | None  # end of turn, e.g. Llama 3's <|eot_id|>
    eom_token_id: int | None  # end of message
    rope_scaling_type: str | None  # <arch>.rope.scaling.type: "none", "linear", "yarn"
    rope_scaling_factor: float | None
    rope_original_context: int | None  # <arch>.rope.scaling.original_context_length


@dataclass
class GGUFMetadata:
    """Metadata fields renamed to HF names, as transformers' `load_gguf_checkpoint` returns them."""

    architecture: str  # general.architecture, e.g. "llama"
    config: dict[str, Any]  # HF config fields (model_type, hidden_size, ..., tie_word_embeddings)
    tokenizer: dict[str, Any]  # tokens, token_type, merges/scores, special ids, tokenizer_type
    tokenizer_config: dict[str, Any]  # chat_template, special ids
    llama_cpp: LlamaCppFields


def read_metadata(reader: GGUFReader) -> GGUFMetadata:
    """Config and tokenizer fields of an open GGUF file; refuses unsupported architectures."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING, GGUF_TOKENIZER_MAPPING

    architecture = field_value(reader, "general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"GGUF architecture `{architecture}` is not supported: pytgi serves GGUF files of the "
            f"architectures {', '.join(f'`{a}`' for a in SUPPORTED_ARCHITECTURES)}"
        )
    config = _renamed(reader, {k: GGUF_CONFIG_MAPPING[k] for k in ("general", architecture)})
    for gguf_key, hf_key in GGUF_CONFIG_MAPPING[architecture].items():
        if hf_key in _REQUIRED and hf_key not in config:
            raise ModelLoadError(f"The GGUF file has no `{architecture}.{gguf_key}` metadata")
    config.update(_renamed(reader, {"tokenizer": GGUF_CONFIG_MAPPING["tokenizer"]}))
    experts = field_value(reader, f"{architecture}.expert_count")
    if experts:  # llama.cpp writes Mixtral as `llama` with experts
        config["num_local_experts"] = int(experts)
        config["num_experts_per_tok"] = int(
            field_value(reader, f"{architecture}.expert_used_count")
        )
    config["tie_word_embeddings"] = all(t.name != "output.weight" for t in reader.tensors)
    tokenizer = _renamed(reader, {"tokenizer": GGUF_TOKENIZER_MAPPING["tokenizer"]})
    if "vocab_size" not in config and "tokens" in tokenizer:
        config["vocab_size"] = len(tokenizer["tokens"])
    return GGUFMetadata(
        architecture=architecture,
        config=config,
        tokenizer=tokenizer,
        tokenizer_config=_renamed(
            reader, {"tokenizer": GGUF_TOKENIZER_MAPPING["tokenizer_config"]}
        ),
        llama_cpp=_llama_cpp_fields(reader, architecture),
    )


def _llama_cpp_fields(reader: GGUFReader, architecture: str) -> LlamaCppFields:
    def tokenizer(key: str) -> Any:
        return field_value(reader, f"tokenizer.ggml.{key}")

    def rope(key: str) -> Any:
        return field_value(reader, f"{architecture}.rope.scaling.{key}")

    return LlamaCppFields(
        tokenizer_model=tokenizer("model"),
        add_bos_token=tokenizer("add_bos_token"),
        add_eos_token=tokenizer("add_eos_token"),
        eot_token_id=tokenizer("eot_token_id"),
        eom_token_id=tokenizer("eom_token_id"),
        rope_scaling_type=rope("type"),
        rope_scaling_factor=rope("factor"),
        rope_original_context=rope("original_context_length"),
    )


def field_value(reader: GGUFReader, key: str) -> Any:
    """A metadata value (arrays of one element unwrapped, as transformers does); None if absent."""
    entry = reader.fields.get(key)
    if entry is None:
        return None
    try:
        value = entry.contents()
    except (ValueError, UnicodeDecodeError, IndexError) as err:
        raise ModelLoadError(f"GGUF metadata `{key}` is malformed: {err}") from err
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _renamed(reader: GGUFReader, table: dict[str, dict[str, str | None]]) -> dict[str, Any]:
    """`{hf_name: value}` for each present `prefix.key` of `table` (None/-1 targets skipped)."""
    out = {}
    for prefix, keys in table.items():
        for key, hf_name in keys.items():
            if hf_name is None or hf_name == -1:
                continue
            value = field_value(reader, f"{prefix}.{key}")
            if value is not None:
                out[hf_name] = value
    return out


def hf_config(meta: GGUFMetadata, freq_factors: list[float] | None = None):
    """A transformers config object pytgi's model for `meta.architecture` accepts (a `llama`
    file with experts is a Mixtral); `freq_factors`: the file's `rope_freqs` tensor, if it has
    one."""
    from transformers import LlamaConfig, MixtralConfig

    fields = dict(meta.config)
    fields.pop("model_type", None)
    name = fields.pop("_model_name_or_path", None)
    scaling = rope_scaling(meta)
    if freq_factors is not None:
        if scaling is not None:
            raise ModelLoadError(
                f"GGUF rope scaling `{scaling['rope_type']}` together with rope_freqs factors is "
                "not supported"
            )
        scaling = {"rope_type": "freq_factors", "freq_factors": freq_factors}
    moe = "num_local_experts" in fields
    config_class = MixtralConfig if moe else LlamaConfig
    config = config_class(**fields, rope_scaling=scaling)
    config.architectures = [
        "MixtralForCausalLM" if moe else SUPPORTED_ARCHITECTURES[meta.architecture]
    ]
    config._name_or_path = name or ""
    return config


def rope_scaling(meta: GGUFMetadata) -> dict[str, Any] | None:
    """HF `rope_scaling` from llama.cpp's `<arch>.rope.scaling.{type,factor,...}` keys."""
    kind, factor = meta.llama_cpp.rope_scaling_type, meta.llama_cpp.rope_scaling_factor
    if kind in (None, "none") or factor in (None, 0.0, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        original = meta.llama_cpp.rope_original_context
        if original is None:
            raise ModelLoadError("GGUF yarn rope scaling without original_context_length")
        return {
            "rope_type": "yarn",
            "factor": float(factor),
            "original_max_position_embeddings": int(original),
        }
    raise ModelLoadError(f"GGUF rope scaling type `{kind}` is not supported")


def end_of_generation_ids(meta: GGUFMetadata) -> list[int]:
    """EOS, then the end-of-turn / end-of-message ids llama.cpp also stops on (no duplicates)."""
    fields = meta.llama_cpp
    ids = [meta.tokenizer.get("eos_token_id"), fields.eot_token_id, fields.eom_token_id]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))
