"""The fast tokenizer a GGUF file describes, and the HF files that let pytgi load it from a dir.

The `tokenizers` backend is built by transformers' GGUF converter (`convert_gguf_tokenizer`, what
`AutoTokenizer.from_pretrained(..., gguf_file=...)` uses), with two corrections taken from the
metadata, where transformers' GGUF tokenizer departs from it:
- BOS/EOS are prepended/appended as `tokenizer.ggml.add_bos_token` / `add_eos_token` say
  (absent: BOS for sentencepiece vocabularies, as llama.cpp does); transformers always adds BOS;
- the EOS token is `tokenizer.ggml.eos_token_id`'s (transformers names the BOS token as EOS).
`write_hf_files` writes tokenizer.json, tokenizer_config.json (with the chat template),
generation_config.json (EOS and end-of-turn ids) and config.json, so that the API process and the
engine load a GGUF model's tokenizer and config exactly as they load any model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, processors

from pytgi.errors import ModelLoadError
from pytgi.models.gguf.metadata import GGUFMetadata, end_of_generation_ids, hf_config


@dataclass
class GGUFTokenizer:
    backend: Tokenizer
    config: dict[str, Any]  # tokenizer_config.json: special tokens, chat template, flags
    eos_token_ids: list[int]  # generation_config.json's eos_token_id


def build_tokenizer(meta: GGUFMetadata) -> GGUFTokenizer:
    """The tokenizer of a GGUF file's metadata (`meta` from `read_metadata`)."""
    from transformers.integrations.ggml import convert_gguf_tokenizer

    if "tokens" not in meta.tokenizer:
        raise ModelLoadError("The GGUF file has no tokenizer (no tokenizer.ggml.tokens)")
    try:
        backend, _ = convert_gguf_tokenizer(meta.config["model_type"], dict(meta.tokenizer))
    except (KeyError, ValueError, TypeError, IndexError) as err:
        raise ModelLoadError(f"Cannot build the GGUF file's tokenizer: {err}") from err
    tokens = meta.tokenizer["tokens"]
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for kind in ("bos", "eos", "unk", "pad"):
        token_id = meta.tokenizer.get(f"{kind}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            config[f"{kind}_token"] = tokens[token_id]
    fields = meta.llama_cpp
    spm = fields.tokenizer_model == "llama"
    config["add_bos_token"] = _flag(fields.add_bos_token, default=spm)
    config["add_eos_token"] = _flag(fields.add_eos_token, default=False)
    if meta.config.get("max_position_embeddings"):
        config["model_max_length"] = int(meta.config["max_position_embeddings"])
    if meta.tokenizer_config.get("chat_template"):
        config["chat_template"] = meta.tokenizer_config["chat_template"]
    backend.post_processor = _special_tokens_processor(backend, config)
    return GGUFTokenizer(backend, config, end_of_generation_ids(meta))


def write_hf_files(
    meta: GGUFMetadata, tokenizer: GGUFTokenizer, out_dir: Path, config=None
) -> Path:
    """Write config.json (`config`, default: the metadata's), generation_config.json and the
    tokenizer files into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = config if config is not None else hf_config(meta)
    config.to_json_file(str(out_dir / "config.json"))
    eos = tokenizer.eos_token_ids
    generation = {"eos_token_id": eos[0] if len(eos) == 1 else eos}
    for kind in ("bos", "pad"):
        if meta.tokenizer.get(f"{kind}_token_id") is not None:
            generation[f"{kind}_token_id"] = int(meta.tokenizer[f"{kind}_token_id"])
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer.config, indent=2))
    tokenizer.backend.save(str(out_dir / "tokenizer.json"))
    return out_dir


def _flag(value: Any, default: bool) -> bool:
    return default if value is None else bool(value)


def _special_tokens_processor(backend: Tokenizer, config: dict[str, Any]):
    """BOS before / EOS after each sequence, as the metadata's add_bos/add_eos flags say."""
    prefix = [config["bos_token"]] if config["add_bos_token"] and "bos_token" in config else []
    suffix = [config["eos_token"]] if config["add_eos_token"] and "eos_token" in config else []
    if not prefix and not suffix:
        return None
    single = " ".join([*prefix, "$A", *suffix])
    second = [f"{tok}:1" for tok in prefix] + ["$B:1"] + [f"{tok}:1" for tok in suffix]
    pair = " ".join([*prefix, "$A", *suffix, *second])
    special = [(tok, backend.token_to_id(tok)) for tok in dict.fromkeys(prefix + suffix)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)
