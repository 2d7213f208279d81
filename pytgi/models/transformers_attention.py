"""pytgi's paged attention behind transformers' attention-function interface.

Registered once as `attn_implementation="pytgi_paged"` (`transformers.AttentionInterface`): every
attention module of a transformers model built with that name calls `paged_attention_forward`
instead of eager/SDPA attention. A step's flat ragged batch runs through the model as one
sequence [1, T] with its real `position_ids`; transformers builds no mask for an attention
function it does not know (masking_utils returns None), and each call hands over the layer's
query [1, H, T, D] and key/value [1, KVH, T, D] after rotary. The function passes them to the
pytgi `Attention` layer attached to the module (`PAGED_ATTR`), which stores K/V in that layer's
paged cache and attends through the backend with the step's metadata (forward context). Models
that still build a mask themselves pass a causal mask over the flat batch; the paged layout is
causal per sequence already, so it is ignored (TGI does the same) once the probe has seen that
the mask is plain causal (no ALiBi bias, no window the call does not name).

A layer's fixed parameters (heads, head sizes, scale, sliding window, soft-cap) are what the
model passes at call time, so they are learned by one probe forward before the model is served
(`probe_attention_calls`): each attention module records its call instead of attending.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

from pytgi.errors import ModelLoadError

ATTENTION_NAME = "pytgi_paged"
PAGED_ATTR = "pytgi_attention"  # the pytgi Attention layer attached to a transformers module

# keyword arguments the models pass that paged attention honours, or that carry bookkeeping
# only (positions are already applied, the mask is the cache's causal layout)
HONOURED_KWARGS = frozenset({"sliding_window", "softcap"})
BOOKKEEPING_KWARGS = frozenset(
    {
        "position_ids",
        "cache_position",
        "position_embeddings",
        "use_cache",
        "past_key_values",
        "past_key_value",
        "output_attentions",
        "is_causal",
    }
)


@dataclass(frozen=True)
class AttentionCall:
    """What one attention module computes, as it called the attention function."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    head_size_v: int
    scale: float
    sliding_window: int | None
    softcap: float | None
    own_mask: bool = False  # the model built its own (plain causal) mask, which is ignored


def is_plain_causal(mask: torch.Tensor) -> bool:
    """Whether the probe's [B, 1, 2, K >= 2] mask (bool: True attends; float: 0 attends, a large
    negative blocks) is exactly causal: no bias on visible keys (ALiBi), the future and any
    padding columns beyond the two keys blocked."""
    if mask.dim() != 4 or mask.shape[-2] != 2 or mask.shape[-1] < 2:
        return False
    causal = torch.zeros(2, mask.shape[-1], dtype=torch.bool)
    causal[:, 0] = causal[1, 1] = True
    if mask.dtype == torch.bool:
        return bool((mask == causal).all())
    return bool((mask[..., causal] == 0).all() and (mask[..., ~causal] < -1e4).all())


def paged_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, D], key / value [1, KVH, T, D] -> (attention output [1, T, H, Dv], None)."""
    attention = getattr(module, PAGED_ATTR, None)
    if attention is None:
        return _record(module, query, key, value, attention_mask, scaling, kwargs)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, D] views
    return attention(q, k, v).unsqueeze(0), None  # [1, T, H, Dv]


def register_paged_attention() -> None:
    """Make `attn_implementation="pytgi_paged"` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)


_CALLS: ContextVar[list[tuple[nn.Module, AttentionCall]] | None] = ContextVar(
    "pytgi_attention_probe", default=None
)


@contextmanager
def probe_attention_calls() -> Iterator[list[tuple[nn.Module, AttentionCall]]]:
    """Inside, attention modules without a pytgi layer record (module, call) and return zeros."""
    if _CALLS.get() is not None:
        raise RuntimeError("attention probes do not nest")
    calls: list[tuple[nn.Module, AttentionCall]] = []
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


def _record(module, query, key, value, attention_mask, scaling, kwargs):
    calls = _CALLS.get()
    if calls is None:
        raise RuntimeError(f"{type(module).__name__} has no paged attention layer (not probed)")
    name = type(module).__name__
    if attention_mask is not None and not is_plain_causal(attention_mask):
        raise ModelLoadError(
            f"{name} builds its own attention mask (ALiBi or another pattern than causal), which "
            "pytgi's paged attention does not take"
        )
    if getattr(module, "is_causal", True) is False:
        raise ModelLoadError(f"{name} is not causal attention; pytgi serves decoder-only models")
    unknown = sorted(
        k
        for k, v in kwargs.items()
        if k not in HONOURED_KWARGS | BOOKKEEPING_KWARGS and v is not None and v is not False
    )
    if unknown:
        raise ModelLoadError(
            f"{name} passes {', '.join(unknown)} to its attention function, which pytgi's paged "
            "attention does not implement"
        )
    head_size = query.shape[-1]
    calls.append(
        (
            module,
            AttentionCall(
                num_heads=query.shape[1],
                num_kv_heads=key.shape[1],
                head_size=head_size,
                head_size_v=value.shape[-1],
                scale=float(scaling) if scaling is not None else head_size**-0.5,
                sliding_window=kwargs.get("sliding_window"),
                softcap=kwargs.get("softcap"),
                own_mask=attention_mask is not None,
            ),
        )
    )
    batch, _, tokens, _ = query.shape
    return query.new_zeros(batch, tokens, query.shape[1], value.shape[-1]), None
