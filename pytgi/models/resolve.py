"""`--model-id` (and `--model-gguf`) -> the local model directory every process loads.

A GGUF model (a .gguf file, or a directory or hub repo holding one; models/gguf/files.py decides)
becomes its prepared directory in pytgi's cache (config and tokenizer from the file's metadata,
models/gguf/prepared.py), which the loader recognises; anything else is a checkpoint directory,
local or a hub snapshot (utils/hub.py). Torch-free: the launcher calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pytgi.config import ModelConfig
from pytgi.models.gguf.files import find_gguf_file
from pytgi.models.gguf.prepared import prepared_dir
from pytgi.utils.hub import resolve_model_dir


def resolve_model(model: ModelConfig, check_config: Callable[[Path], object] | None = None) -> Path:
    """The local directory of `model`, downloading what a hub model needs; `check_config(dir)`
    runs once its config.json is there, before any weight is fetched (it raises to refuse)."""
    gguf_file = find_gguf_file(model, model.gguf_file)
    if gguf_file is None:
        return resolve_model_dir(model, check_config=check_config)
    directory = prepared_dir(gguf_file, model.cache_dir)
    if check_config is not None:
        check_config(directory)
    return directory
