"""Device-specific interfaces: the platform (device, memory, collectives backend) and attention.

`AttentionBatch` is what the worker's InputBuilder tells the attention backend about a step; the
backend turns it into its own metadata once per step (`build_metadata`), and every attention layer
then calls `forward` with that metadata and its own KV cache.

Row order contract: the rows whose query is a single token ("decode rows") come first, so their
tokens are the first `num_decode_rows` tokens of the flat batch; prefill rows (several tokens)
follow.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class AttentionBatch:
    """One step's attention layout. Row i runs tokens [query_starts[i], query_starts[i] +
    num_queries[i]) of the flat batch at positions start_positions[i].., attending to every earlier
    position of its sequence, whose K/V live at slot = block_tables[i][pos // block_size] *
    block_size + pos % block_size.
    """

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token
    query_starts: list[int]
    num_queries: list[int]
    start_positions: list[int]  # tokens already in the cache before this step
    block_tables: list[list[int]]
    block_size: int
    num_decode_rows: int

    @property
    def num_rows(self) -> int:
        return len(self.num_queries)


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Per-step metadata shared by all layers (indices, masks), built once per step."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        metadata: Any,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] (this step's tokens) -> out [T, H, D]; writes k/v to the
        cache.
        """

    @abstractmethod
    def kv_cache_shape(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> tuple[int, ...]:
        """Shape of one layer's K (and V) cache tensor."""


class Platform(ABC):
    """The device pytgi runs on: chosen once at start-up by `backends.selector`."""

    name: str
    device: torch.device
    dist_backend: str

    @abstractmethod
    def default_dtype(self) -> torch.dtype:
        """The model dtype when --dtype is not given."""

    @abstractmethod
    def available_memory_bytes(self) -> int:
        """Memory still free for the KV cache (after weights and a warm-up step)."""

    @abstractmethod
    def default_kv_cache_cap_bytes(self) -> int | None:
        """An upper bound on the KV cache when --max-kv-cache-bytes is not given (None: no cap)."""

    def synchronize(self) -> None:  # noqa: B027
        """Wait for queued device work (timings); nothing to do on CPU."""
