"""The NVIDIA GPU platform: one device per tensor-parallel rank (cuda:{rank}), NCCL for the
model's collectives (each step's metadata still travels on the gloo control group), GPU memory from
`torch.cuda.mem_get_info` within `--cuda-memory-fraction`, the Triton kernels (ops.py and the
attention backend), the quantized linear products (quant_ops.py) and CUDA-graph replay of decode
steps.

Default dtype as TGI's: float16, except the families TGI serves in bfloat16 (TGI_COMPATIBILITY.md
§15).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import ModuleType
from typing import ClassVar

import torch

from pytgi.backends.base import DecodeAccelerator, Platform
from pytgi.config import DeviceConfig

logger = logging.getLogger(__name__)

# model_type values whose TGI default dtype is bfloat16 (the others default to float16)
BF16_MODEL_TYPES = frozenset(
    {
        "gemma", "gemma2", "gemma3", "gemma3_text", "dbrx", "deepseek_v2", "deepseek_v3",
        "mllama", "idefics3", "paligemma", "llama4", "qwen2_vl", "qwen2_5_vl",
    }
)  # fmt: skip


def default_cuda_dtype(model_type: str | None) -> torch.dtype:
    return torch.bfloat16 if model_type in BF16_MODEL_TYPES else torch.float16


@dataclass(frozen=True)
class CudaPlatform(Platform):
    """Frozen: the Triton kernels (or none) are chosen once, when the platform is built. Its
    device is the process's current CUDA device, which `bind_rank` sets once (one rank per
    process) before the model is built."""

    name: ClassVar[str] = "cuda"
    dist_backend: ClassVar[str] = "nccl"

    config: DeviceConfig = field(default_factory=DeviceConfig)
    kernels: ModuleType | None = field(init=False, default=None)

    def __post_init__(self):
        if not self.config.kernels:
            logger.info(
                "Triton layer kernels disabled (--disable-custom-kernels or PYTGI_CPU_KERNELS=0): "
                "pure-torch ops"
            )
            return
        from pytgi.backends.cuda import ops

        object.__setattr__(self, "kernels", ops)  # frozen: set here only

    @property
    def index(self) -> int:
        return torch.cuda.current_device()

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def bind_rank(self, rank: int) -> None:
        torch.cuda.set_device(rank)

    def device_for_rank(self, rank: int) -> torch.device:
        return torch.device("cuda", rank)

    def default_dtype(self, model_type: str | None = None) -> torch.dtype:
        return default_cuda_dtype(model_type)

    def kernels_for(self, dtype: torch.dtype) -> ModuleType | None:
        return self.kernels  # every kernel takes fp32, fp16 and bf16

    def attention_backend(self, dtype: torch.dtype):
        from pytgi.backends.cuda.attention import TritonAttentionBackend

        properties = torch.cuda.get_device_properties(self.index)
        return TritonAttentionBackend(num_sms=properties.multi_processor_count)

    def quant_ops(self, dtype: torch.dtype):
        from pytgi.backends.cuda.quant_ops import CudaQuantOps

        capability = torch.cuda.get_device_capability(self.index)
        return CudaQuantOps(self.device, use_triton=self.kernels is not None,
                            scaled_mm=capability >= (8, 9))  # fmt: skip

    def decode_accelerator(
        self, model: torch.nn.Module, kv_cache_dtype: torch.dtype
    ) -> DecodeAccelerator | None:
        sizes = self.config.cuda_graphs
        if not sizes or not self.config.decode_accelerator:
            logger.info("CUDA graphs off (--cuda-graphs 0 or PYTGI_FUSED_DECODE=0): eager decode")
            return None
        if not model.steps_capturable():
            logger.info("CUDA graphs off: this model's layers choose work on the host per step")
            return None
        from pytgi.backends.cuda.graphs import CudaGraphRunner

        return CudaGraphRunner(sizes, self.device)

    def available_memory_bytes(self) -> int:
        """Free device memory outside what `--cuda-memory-fraction` keeps away (as TGI). Memory
        torch's allocator still caches (the warm-up step's activations, released graphs) is not
        free here, so it stays there for the steps and graphs that need it again."""
        free, total = torch.cuda.mem_get_info(self.index)
        return max(0, int(free - (1.0 - self.config.cuda_memory_fraction) * total))

    def default_kv_cache_cap_bytes(self) -> int | None:
        return None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)
