"""The per-forward context: what attention layers read instead of taking metadata arguments.

The ModelRunner wraps each forward in `forward_context(...)`; `layers.attention.Attention` calls
`get_forward_context()`. Set for exactly one forward; nesting is a bug. It lives in `layers/` (not
`worker/`, where DESIGN.md first put it) so that imports keep pointing downward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pytgi.backends.base import AttentionBackend


@dataclass
class ForwardContext:
    backend: AttentionBackend
    attn_metadata: Any  # the backend's per-step metadata


_CONTEXT: ForwardContext | None = None


@contextmanager
def forward_context(backend: AttentionBackend, attn_metadata: Any) -> Iterator[ForwardContext]:
    global _CONTEXT
    assert _CONTEXT is None, "forward_context does not nest"
    _CONTEXT = ForwardContext(backend, attn_metadata)
    try:
        yield _CONTEXT
    finally:
        _CONTEXT = None


def get_forward_context() -> ForwardContext:
    assert _CONTEXT is not None, "attention ran outside a forward_context"
    return _CONTEXT
