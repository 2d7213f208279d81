"""What layers need to know when they are built: the platform's decisions for this model.

`build_model` sets a `BuildContext` around the model's construction; every op reads it once, in
its constructor, to pick its implementation (`CustomOp`), parallel layers take their shard from
its `tp`, and attention layers ask its backend for their per-layer implementation. Nothing reads
it per call. A layer built outside any context is an error: tests that build layers directly set
a context themselves (the reference one is `BuildContext()`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from pytgi.backends.base import AttentionBackend, QuantOps
from pytgi.distributed.parallel_state import TPInfo


@dataclass(frozen=True)
class BuildContext:
    platform_name: str = "cpu"
    kernels: Any | None = None  # the platform's compiled kernels for this dtype; None: reference
    attention: AttentionBackend | None = None  # None: the CPU backend on the reference path
    dtype: torch.dtype = torch.float32
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype
    max_model_len: int | None = None  # positions the model must serve (rotary tables)
    tp: TPInfo = TPInfo(rank=0, world_size=1)  # this rank's place in the tensor-parallel group
    # the platform's quantized products; None: the CPU ones on `kernels` (the best kernel table)
    quant_ops: QuantOps | None = None

    def attention_backend(self) -> AttentionBackend:
        if self.attention is not None:
            return self.attention
        from pytgi.backends.cpu.attention import CpuAttentionBackend

        return CpuAttentionBackend(None)

    def quant(self) -> QuantOps:
        if self.quant_ops is not None:
            return self.quant_ops
        from pytgi.backends.cpu.quant_ops import CpuQuantOps

        return CpuQuantOps(self.kernels)


_CONTEXT: ContextVar[BuildContext | None] = ContextVar("pytgi_build_context", default=None)


@contextmanager
def build_context(context: BuildContext) -> Iterator[BuildContext]:
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


def current_build_context() -> BuildContext:
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("a layer was built outside a build context (see layers/build_context)")
    return context
