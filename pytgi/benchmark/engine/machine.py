"""What the benchmark ran on, recorded next to every result (numbers mean little without it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from pytgi.version import __version__

CPUINFO = Path("/proc/cpuinfo")
LOADAVG = Path("/proc/loadavg")


def machine_info(device: str = "cpu", omp_wait_policy: str | None = None) -> dict:
    import transformers

    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    return {
        "device": device,
        "gpu_name": gpu,
        "cpu_model": cpu_model(),
        "num_cores": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": torch.get_num_threads(),
        "omp_wait_policy": omp_wait_policy,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "pytgi_version": __version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "load_average": load_average(),
    }


def cpu_model() -> str:
    if CPUINFO.exists():
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    if not LOADAVG.exists():
        return None
    return [float(v) for v in LOADAVG.read_text().split()[:3]]
