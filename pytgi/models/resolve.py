"""`--model-id` (and `--model-gguf`) -> the local model directory every process loads.

A GGUF model (a .gguf file, or a directory or hub repo holding one; models/gguf/files.py decides)
becomes its prepared directory in pytgi's cache (config and tokenizer from the file's metadata,
models/gguf/prepared.py), which the loader recognises; anything else is a checkpoint directory,
local or a hub snapshot (utils/hub.py). In TGI's form (`--model-id MODEL --model-gguf FILE`) the
tokenizer and chat template come from MODEL when it has a `tokenizer.json`, as in TGI: the
prepared directory gets MODEL's tokenizer files in place of the ones read from the GGUF file.
Torch-free: the launcher calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pytgi.config import LoRAAdapter, ModelConfig
from pytgi.models.gguf.files import find_gguf_file, tgi_form_file
from pytgi.models.gguf.prepared import TOKENIZER_FILES, prepared_dir, with_tokenizer
from pytgi.utils import hub
from pytgi.utils.hub import resolve_model_dir


def resolve_model(model: ModelConfig, check_config: Callable[[Path], object] | None = None) -> Path:
    """The local directory of `model`, downloading what a hub model needs; `check_config(dir)`
    runs once its config.json is there, before any weight is fetched (it raises to refuse)."""
    gguf_file = find_gguf_file(model, model.gguf_file)
    if gguf_file is None:
        return resolve_model_dir(model, check_config=check_config)
    directory = prepared_dir(gguf_file, model.cache_dir)
    if tgi_form_file(model, model.gguf_file) is not None:
        tokenizer_dir = _tokenizer_dir(model)
        if tokenizer_dir is not None:
            directory = with_tokenizer(directory, tokenizer_dir)
    if check_config is not None:
        check_config(directory)
    return directory


def _tokenizer_dir(model: ModelConfig) -> Path | None:
    """The directory holding `--model-id`'s tokenizer.json (a local directory, or a snapshot of
    the hub repo's tokenizer files only); None when the model has none."""
    local = hub.local_model_dir(model.model_id)
    if local is not None:
        return local if (local / "tokenizer.json").is_file() else None
    if "tokenizer.json" not in hub.list_repo_files(model):
        return None
    return resolve_model_dir(model, allow_patterns=list(TOKENIZER_FILES))


ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors"]


def resolve_adapter(adapter: LoRAAdapter, model: ModelConfig) -> Path:
    """A `--lora-adapters` entry's local directory: the given path, or the hub repo's snapshot
    (its adapter config and safetensors weights, at the entry's revision)."""
    hub = replace(model, model_id=adapter.source, revision=adapter.revision, gguf_file=None)
    return resolve_model_dir(hub, allow_patterns=ADAPTER_PATTERNS)


MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"


def resolve_speculator(model: ModelConfig, speculate: int | None) -> tuple[ModelConfig, int | None]:
    """TGI's speculator detection: when `--model-id`'s config.json has `medusa_num_heads` (Medusa)
    or `model_type: mlp_speculator`, the served model is its `base_model_name_or_path` and the
    speculator rides along; `--speculate` defaults to its number of heads and may not exceed it.
    Returns the model to serve and the number of draft tokens (`speculate` unchanged otherwise)."""
    import json

    from pytgi.config import SpeculatorConfig
    from pytgi.errors import ConfigError

    if find_gguf_file(model, model.gguf_file) is not None:
        return model, speculate
    config_dir = resolve_model_dir(model, allow_patterns=["config.json"])
    config_path = config_dir / "config.json"
    raw = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if "medusa_num_heads" in raw:
        kind, heads, patterns = (
            "medusa",
            int(raw["medusa_num_heads"]),
            ["config.json", MEDUSA_WEIGHTS],
        )
    elif raw.get("model_type") == "mlp_speculator":
        kind, heads, patterns = (
            "mlp_speculator",
            int(raw["n_predict"]),
            ["config.json", "*.safetensors"],
        )
    else:
        return model, speculate
    if speculate is not None and speculate > heads:
        raise ConfigError(
            f"Speculate is set to `{speculate}` but this {kind} models only has `{heads}` heads, "
            "please make them match"
        )
    directory = resolve_model_dir(model, allow_patterns=patterns)
    base = raw.get("base_model_name_or_path")
    if not base:
        raise ConfigError(
            f"the {kind} checkpoint {model.model_id} names no base_model_name_or_path"
        )
    speculator = SpeculatorConfig(kind, str(directory), heads)
    served = replace(model, model_id=base, revision=None, speculator=speculator)
    return served, heads if speculate is None else speculate
