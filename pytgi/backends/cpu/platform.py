"""The CPU platform: fp32 by default, RAM from /proc/meminfo, gloo collectives, and the compiled
kernels (csrc/) when the device config allows them and they build. What it chooses at start-up
(the kernels, the quantized kernel table) does not change afterwards."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import ClassVar

import torch

from pytgi.backends.base import DecodeAccelerator, Platform
from pytgi.config import DeviceConfig

logger = logging.getLogger(__name__)

# RAM is shared with the OS, the API process and other ranks: never take more than this by default.
DEFAULT_KV_CACHE_CAP_BYTES = 2 * 1024**3


def read_mem_available_bytes(path: str = "/proc/meminfo") -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    page_size, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_AVPHYS_PAGES")
    return page_size * pages


# the cache dtypes the compiled kernels store and read (csrc/attention.h)
KERNEL_KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                    torch.float8_e5m2, torch.int8)  # fmt: skip


@dataclass(frozen=True)
class CpuPlatform(Platform):
    """Frozen: the compiled kernels and the quantized kernel table (`quant_isa`, e.g. "avx512vnni"
    or "avx2") are chosen once, when the platform is built, and every layer reads them from here."""

    name: ClassVar[str] = "cpu"
    dist_backend: ClassVar[str] = "gloo"

    config: DeviceConfig = field(default_factory=DeviceConfig)
    kernels: ModuleType | None = field(init=False, default=None)
    quant_isa: str = field(init=False, default="auto")  # the table every quantized call names

    def __post_init__(self):
        if not self.config.kernels:
            logger.info("CPU kernels disabled (PYTGI_CPU_KERNELS=0): pure-torch path")
            return
        from pytgi.backends.cpu.kernels import load_cpu_kernels, resolve_quant_isa

        kernels = load_cpu_kernels(self.config.kernel_build_root)
        if kernels is not None:
            # frozen: __post_init__ is the one place these are set
            object.__setattr__(self, "kernels", kernels)
            object.__setattr__(self, "quant_isa", resolve_quant_isa(kernels, self.config.quant_isa))

    def device_for_rank(self, rank: int) -> torch.device:
        return torch.device("cpu")

    def default_dtype(self, model_type: str | None = None) -> torch.dtype:
        # bf16/fp16 matmuls and SDPA are 3-40x slower than fp32 on CPUs without AMX / AVX512-BF16
        return torch.float32

    def kernels_for(self, dtype: torch.dtype) -> ModuleType | None:
        return self.kernels if dtype == torch.float32 else None  # the kernels are fp32 only

    def attention_backend(self, dtype: torch.dtype):
        from pytgi.backends.cpu.attention import CpuAttentionBackend

        return CpuAttentionBackend(self.kernels_for(dtype))

    def quant_ops(self, dtype: torch.dtype):
        from pytgi.backends.cpu.quant_ops import CpuQuantOps

        return CpuQuantOps(self.kernels_for(dtype), self.quant_isa, self.config.native_kquants)

    def decode_accelerator(
        self, model: torch.nn.Module, kv_cache_dtype: torch.dtype
    ) -> DecodeAccelerator | None:
        # the stack reads every cache format below an fp32 model (whose packed weights it needs)
        kernels = self.kernels_for(torch.float32) if kv_cache_dtype in KERNEL_KV_DTYPES else None
        if kernels is None or not self.config.decode_accelerator:
            return None
        from pytgi.backends.cpu.fused_decode import FusedDecodeStack

        return FusedDecodeStack.for_model(model, kernels, self.quant_isa)

    def available_memory_bytes(self) -> int:
        return read_mem_available_bytes()

    def default_kv_cache_cap_bytes(self) -> int | None:
        return DEFAULT_KV_CACHE_CAP_BYTES

    def ranks_share_memory(self) -> bool:
        return True

    def threads_per_rank(self, world_size: int) -> int | None:
        if world_size == 1:
            return None
        return max(1, (os.cpu_count() or 1) // world_size)  # ranks share the cores
