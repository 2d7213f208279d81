"""`--env`: the runtime environment and versions, logged at start-up as TGI's launcher does (to
paste into a bug report)."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from pytgi.version import __version__

_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "fastapi",
             "uvicorn", "pydantic")  # fmt: skip


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _torch_lines() -> list[str]:
    import torch

    lines = [f"CPU capability: {torch.backends.cpu.get_cpu_capability()}"]
    lines.append(f"torch threads: {torch.get_num_threads()}")
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(f"CUDA {torch.version.cuda}: {', '.join(names)}")
    else:
        lines.append("CUDA: not available")
    return lines


def describe_environment() -> str:
    from pytgi.server.context import TGI_VERSION

    lines = [
        f"pytgi: {__version__} (TGI API {TGI_VERSION})",
        f"Python: {sys.version.split()[0]} ({platform.python_implementation()}) at {sys.prefix}",
        f"Platform: {platform.platform()} {platform.machine()}, {os.cpu_count()} CPUs",
    ]
    lines += [f"{name}: {_version(name)}" for name in _PACKAGES]
    lines += _torch_lines()
    return "\n".join(lines)
