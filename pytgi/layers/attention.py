"""The attention layer: stores this step's K/V in its cache and attends through the backend.

Per-step metadata (slot mapping, gather indices, masks) comes from the forward context, so model
code passes only q, k and v. The KV cache tensors are bound by the ModelRunner after allocation.
"""

from __future__ import annotations

import torch
from torch import nn

from pytgi.layers.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
    ):
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.scale = scale
        self.sliding_window = sliding_window
        self.kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] -> [T, H, D]."""
        assert self.kv_cache is not None, "KV cache not bound (ModelRunner.bind_kv_cache)"
        ctx = get_forward_context()
        return ctx.backend.forward(
            q, k, v, self.kv_cache, ctx.attn_metadata, self.scale, self.sliding_window
        )
