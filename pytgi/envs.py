"""The only reader of os.environ. TGI's variable names; read when called, never at import time.

The CLI uses `flag_default(name)` as the fallback of each flag (TGI: every flag has an env twin);
other helpers cover variables that are not flags (HF_TOKEN, HF_HUB_OFFLINE, ...).
"""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}


def get(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def get_bool(name: str, default: bool = False) -> bool:
    value = get(name)
    return default if value is None else value.strip().lower() in _TRUE


def hf_token() -> str | None:
    return get("HF_TOKEN") or get("HUGGING_FACE_HUB_TOKEN") or get("HF_API_TOKEN")


def hub_offline() -> bool:
    return get_bool("HF_HUB_OFFLINE")


def hub_cache_dir() -> str | None:
    return get("HUGGINGFACE_HUB_CACHE") or get("HF_HUB_CACHE")


def compute_type() -> str | None:
    """TGI's `x-compute-type` override (the launcher's default is `{num_shard}-{device}`)."""
    return get("COMPUTE_TYPE")


def set_default_threading_env() -> None:
    """OpenMP threads must not spin while waiting (cpu-kernels.md §7); set before torch loads."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def device_config():
    """The device config from PYTGI_CPU_KERNELS=0 (keep the pure-torch path) and
    PYTGI_FUSED_DECODE=0 (run decode steps layer by layer even where the fused CPU decode stack
    could run them, for comparisons); both default to on."""
    from pytgi.config import DeviceConfig

    return DeviceConfig(
        kernels=get_bool("PYTGI_CPU_KERNELS", default=True),
        decode_accelerator=get_bool("PYTGI_FUSED_DECODE", default=True),
    )
