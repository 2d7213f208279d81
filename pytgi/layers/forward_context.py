"""The per-forward context: what layers read instead of taking per-step arguments.

The ModelRunner wraps each forward in `forward_context(...)`: the attention backend's metadata for
the step, every attention layer's KV cache (by layer name), and, when the runner's decode-step
accelerator takes this step, the callable that runs the whole decoder stack. Set for exactly one
forward; nesting is a bug. It lives in `layers/` (not `worker/`) so that imports keep pointing
downward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pytgi.backends.base import FusedLayers, KVCache
from pytgi.layers.lora import LoRABatch


@dataclass
class ForwardContext:
    attn_metadata: Any  # the attention backend's per-step metadata
    kv_caches: dict[str, KVCache]  # attention layer name -> its cache
    fused_layers: FusedLayers | None = None  # the accelerator's decoder stack for this step
    lora: LoRABatch | None = None  # the rows of the step that run a LoRA adapter


_CONTEXT: ContextVar[ForwardContext | None] = ContextVar("pytgi_forward_context", default=None)


@contextmanager
def forward_context(
    attn_metadata: Any,
    kv_caches: dict[str, KVCache],
    fused_layers: FusedLayers | None = None,
    lora: LoRABatch | None = None,
) -> Iterator[ForwardContext]:
    if _CONTEXT.get() is not None:
        raise RuntimeError("forward_context does not nest")
    context = ForwardContext(attn_metadata, kv_caches, fused_layers, lora)
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


def get_forward_context() -> ForwardContext:
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("a layer ran outside a forward_context")
    return context


def current_lora_batch() -> LoRABatch | None:
    """The step's LoRA rows; None outside a forward (a layer called on its own) or without any."""
    context = _CONTEXT.get()
    return context.lora if context is not None else None
