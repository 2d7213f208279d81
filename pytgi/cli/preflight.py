"""Checks the launcher runs before it starts the engine, so that a mistake costs seconds, not a
model load, and ends with one line naming the cause: the HTTP port is free (it is bound here and
handed to uvicorn, so nothing can take it during warm-up), and the model directory has a
`config.json` naming a supported architecture and weight files.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from pytgi.errors import ConfigError, ModelLoadError
from pytgi.models.registry import resolve_architecture


def bind_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not yet listening: connections are refused until uvicorn
    listens on it after warm-up. Raises `ConfigError` when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"Cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(False)
    return sock


def check_model_dir(model_dir: Path) -> str:
    """The architecture pytgi will run from `model_dir`; raises `ModelLoadError` with the cause."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(f"No config.json in {model_dir}: not a model directory")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"Cannot read {config_path}: {exc}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} is not a JSON object")
    architecture, _ = resolve_architecture(config.get("architectures"))
    if not _has_weights(model_dir):
        raise ModelLoadError(f"No weights in {model_dir} (no *.safetensors files)")
    return architecture


def _has_weights(model_dir: Path) -> bool:
    converted = model_dir.parent / f"{model_dir.name}.pytgi-safetensors"  # see models/weights.py
    if any(model_dir.glob("*.safetensors")) or any(converted.glob("*.safetensors")):
        return True
    # pickle-only directories get weights.py's detailed refusal (or conversion) in the engine
    return any(model_dir.glob("*.bin"))
