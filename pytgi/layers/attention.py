"""The attention layer: stores this step's K/V in its cache and attends through its backend impl.

When built, a layer fixes its `AttentionParams`, gets its implementation from the build context's
attention backend, and declares the KV cache it needs (`kv_cache_spec`). Per step, the forward
context carries the backend's metadata and the caches, keyed by the layer's name (its module
path), so model code passes only q, k and v.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pytgi.backends.base import AttentionParams, KVCacheSpec, KVScales, kv_cache_spec
from pytgi.layers.build_context import current_build_context
from pytgi.layers.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        *,
        prefix: str,
        logits_soft_cap: float | None = None,
        alibi_slopes: tuple[float, ...] | None = None,
        head_size_v: int | None = None,
        attention_chunk_size: int | None = None,
    ):
        super().__init__()
        context = current_build_context()
        self.layer_name = prefix
        self.params = AttentionParams(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_dim,
            scale=scale,
            head_size_v=head_size_v,
            sliding_window=sliding_window,
            attention_chunk_size=attention_chunk_size,
            logits_soft_cap=logits_soft_cap,
            alibi_slopes=alibi_slopes,
            kv_cache_dtype=context.kv_cache_dtype,
        )
        self.impl = context.attention_backend().make_impl(self.params)
        self._kv_cache_spec = kv_cache_spec(self.params, context.dtype)

    @property
    def num_heads(self) -> int:
        return self.params.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.params.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.params.head_size

    @property
    def scale(self) -> float:
        return self.params.scale

    @property
    def sliding_window(self) -> int | None:
        return self.params.sliding_window

    def kv_cache_spec(self) -> KVCacheSpec:
        return self._kv_cache_spec

    def set_kv_scales(self, scales: KVScales) -> None:
        self.impl.set_kv_scales(scales)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k [T, KVH, D], v [T, KVH, Dv] -> [T, H, Dv]."""
        ctx = get_forward_context()
        return self.impl.forward(q, k, v, ctx.kv_caches[self.layer_name], ctx.attn_metadata)


def alibi_slopes(num_heads: int, scale: float = 1.0) -> tuple[float, ...]:
    """ALiBi's per-head slopes (Press et al.; BLOOM's and Baichuan's formula): for the largest
    power of two n <= num_heads, 2^(-8 i / n) for i = 1..n, then every other slope of the 2n
    sequence for the remaining heads; each times `scale` (Falcon adds the bias before its
    1/sqrt(head_dim) scaling: scale = head_dim ** -0.5)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / closest)
    slopes = [base**i for i in range(1, closest + 1)]
    extra_base = 2.0 ** (-4.0 / closest)
    slopes += [extra_base**i for i in range(1, 2 * (num_heads - closest), 2)]
    return tuple(s * scale for s in slopes)
