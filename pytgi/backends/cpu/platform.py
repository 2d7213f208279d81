"""The CPU platform: fp32 by default, RAM from /proc/meminfo, gloo collectives."""

from __future__ import annotations

import os

import torch

from pytgi.backends.base import Platform

# RAM is shared with the OS, the API process and other ranks: never take more than this by default.
DEFAULT_KV_CACHE_CAP_BYTES = 2 * 1024**3


def read_mem_available_bytes(path: str = "/proc/meminfo") -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    page_size, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_AVPHYS_PAGES")
    return page_size * pages


class CpuPlatform(Platform):
    name = "cpu"
    device = torch.device("cpu")
    dist_backend = "gloo"

    def default_dtype(self) -> torch.dtype:
        # bf16/fp16 matmuls and SDPA are 3-40x slower than fp32 on CPUs without AMX / AVX512-BF16
        return torch.float32

    def available_memory_bytes(self) -> int:
        return read_mem_available_bytes()

    def default_kv_cache_cap_bytes(self) -> int | None:
        return DEFAULT_KV_CACHE_CAP_BYTES
