"""What layers need to know when they are built: the platform's decisions for this model.

`build_model` sets a `BuildContext` around the model's construction; every op reads it once, in
its constructor, to pick its implementation (`CustomOp`), and attention layers ask its backend
for their per-layer implementation. Nothing reads it per call. A layer built outside any context
(most layer tests) gets the plain-torch reference path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from pytgi.backends.base import AttentionBackend


@dataclass(frozen=True)
class BuildContext:
    platform_name: str = "cpu"
    kernels: Any | None = None  # the platform's compiled kernels for this dtype; None: reference
    attention: AttentionBackend | None = None  # None: the CPU backend on the reference path
    dtype: torch.dtype = torch.float32
    kv_cache_dtype: torch.dtype | None = None  # None: the model dtype
    max_model_len: int | None = None  # positions the model must serve (rotary tables)

    def attention_backend(self) -> AttentionBackend:
        if self.attention is not None:
            return self.attention
        from pytgi.backends.cpu.attention import CpuAttentionBackend

        return CpuAttentionBackend(None)


_CONTEXT: BuildContext | None = None


@contextmanager
def build_context(context: BuildContext) -> Iterator[BuildContext]:
    global _CONTEXT
    previous, _CONTEXT = _CONTEXT, context
    try:
        yield context
    finally:
        _CONTEXT = previous


def current_build_context() -> BuildContext:
    return _CONTEXT if _CONTEXT is not None else BuildContext(dtype=torch.get_default_dtype())
