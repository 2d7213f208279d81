"""LoRA deltas on linear layers, several adapters in one batch.

A linear layer holds, per loaded adapter slot (1..N; 0 is the base model), this rank's
`A [r, in_local]` and `B [out_local, r]`, B already multiplied by the adapter's scaling
(alpha / r, or alpha / sqrt(r) with rsLoRA). A fused layer (q/k/v, gate/up) holds its shards'
A matrices stacked along r and a block-diagonal B, so each adapter costs one matmul pair per layer.

The step's `LoRABatch` (in the forward context) lists, per adapter present in the step, the flat
token rows that use it; a layer adds `(x[rows] @ A^T) @ B^T` to those rows of its output. Rows
of the base model are untouched. The deltas run in the activations' dtype, never in a quantized
base weight's format.

Tensor parallelism, as TGI shards adapters: a column-parallel layer keeps A whole and B's rows of
its output shard; a row-parallel layer keeps A's columns of its input shard and B whole, and adds
its partial delta before the all-reduce (the sum over ranks of x_r A_r^T B^T is x A^T B^T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoRABatch:
    """One step's adapter rows: (adapter slot, flat token rows [n] int64) per adapter present."""

    segments: tuple[tuple[int, torch.Tensor], ...]

    @staticmethod
    def from_slots(slots: torch.Tensor) -> LoRABatch | None:
        """slots [T] int64 (0: base model) -> the segments, None when no row uses an adapter."""
        used = torch.unique(slots).tolist()
        segments = tuple(
            (slot, torch.nonzero(slots == slot).flatten()) for slot in used if slot != 0
        )
        return LoRABatch(segments) if segments else None


@dataclass(frozen=True)
class LoRAWeights:
    a: torch.Tensor  # [r, in_local]
    b: torch.Tensor  # [out_local, r], scaled


def add_lora(
    adapters: dict[int, LoRAWeights], batch: LoRABatch, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """y [T, out_local] plus each adapter's delta on its rows of x [T, in_local]."""
    for slot, rows in batch.segments:
        weights = adapters.get(slot)
        if weights is None:  # this layer is not a target of that adapter
            continue
        xa = x.index_select(0, rows) @ weights.a.t()  # [n, r]
        y = y.index_add(0, rows, (xa @ weights.b.t()).to(y.dtype))  # [T, out_local]
    return y
