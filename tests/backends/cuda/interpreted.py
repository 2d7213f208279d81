"""The CUDA platform on CPU tensors, for tests without a GPU: its Triton kernels (run by Triton's
interpreter), attention backend and CUDA-graph runner, whose steps are "recorded" by running them
eagerly again at each replay over the same static buffers and into the same output tensor. That
checks everything a graph relies on (static inputs, padding, metadata built over the buffers)
except the CUDA graph itself, which the `gpu` tests cover."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from pytgi.backends.cuda import ops
from pytgi.backends.cuda.attention import TritonAttentionBackend
from pytgi.backends.cuda.graphs import CudaGraphRunner
from pytgi.backends.cuda.platform import CudaPlatform
from pytgi.backends.cuda.quant_ops import CudaQuantOps


class EagerRecorder:
    """`record(fn)` -> (replay, output): replay re-runs fn and writes its result into output."""

    def __init__(self):
        self.replays: Counter[int] = Counter()  # by the output's number of rows
        self.records = 0

    def record(self, fn):
        self.records += 1
        output = fn()
        rows = output.shape[0]

        def replay() -> None:
            self.replays[rows] += 1
            output.copy_(fn())

        return replay, output

    def reset(self) -> None:
        pass


@dataclass(frozen=True)
class InterpretedCudaPlatform(CudaPlatform):
    """CudaPlatform on CPU tensors: eager unless `cuda_graphs` names sizes (then recorded by
    `recorder`), `num_sms` programs for the attention kernels, 1 GiB "free"."""

    cuda_graphs: tuple[int, ...] = ()
    num_sms: int = 4
    recorder: EagerRecorder = field(default_factory=EagerRecorder)

    def __post_init__(self):
        object.__setattr__(self, "config", replace(self.config, cuda_graphs=self.cuda_graphs))
        object.__setattr__(self, "kernels", ops)

    @property
    def index(self) -> int:
        return 0

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def bind_rank(self, rank: int) -> None:
        pass

    def device_for_rank(self, rank: int) -> torch.device:
        return self.device

    def attention_backend(self, dtype: torch.dtype) -> TritonAttentionBackend:
        return TritonAttentionBackend(num_sms=self.num_sms)

    def quant_ops(self, dtype: torch.dtype) -> CudaQuantOps:
        return CudaQuantOps(self.device, use_triton=True, scaled_mm=False)

    def decode_accelerator(self, model, kv_cache_dtype) -> CudaGraphRunner | None:
        if not self.config.cuda_graphs:
            return None
        return CudaGraphRunner(self.config.cuda_graphs, self.device, recorder=self.recorder)

    def available_memory_bytes(self) -> int:
        return 1 << 30

    def synchronize(self) -> None:
        pass
