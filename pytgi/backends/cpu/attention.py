"""Paged attention on CPU: `F.scaled_dot_product_attention` (fp32, `enable_gqa`), slot-major cache.

Cache layout, per layer: K and V are each [num_blocks * block_size, kv_heads, head_dim]; a token's
slot is block * block_size + pos % block_size, so one `index_copy_` stores a whole step's tokens and
one `index_select` gathers any row's context. (A head-major per-sequence cache reads faster, but a
paged cache is what prefix sharing and preemption need; the gather costs ~2x of attention time.)

Per step, `build_metadata` precomputes gather indices and masks, lazily per sliding-window value
(so once per step, shared by all layers):
- decode rows (1 query token): one batched SDPA over K/V gathered by a padded [B, L] slot index,
  with a length / window mask only when the rows' visible lengths differ;
- fresh prompts (nothing cached): SDPA over this step's own K/V with is_causal (no cache read);
- other prefill rows (chunked prefill, prefix-cache hits): K/V gathered from the cache and an
  explicit bottom-right causal (and window) mask [q, kv].
Sliding window W (transformers' convention): a query at position p sees keys at p - W < pos <= p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pytgi.backends.base import AttentionBackend, AttentionBatch


@dataclass
class DecodeRows:
    slot_index: torch.Tensor  # [B, L] int64: cache slots of each row's visible keys (padded)
    mask: torch.Tensor | None  # [B, 1, 1, L] bool, None when every row sees all L keys


@dataclass
class PrefillRow:
    start: int  # flat token range of the row's queries
    end: int
    slot_index: (
        torch.Tensor | None
    )  # [S] cache slots of the visible keys; None = this step's own K/V
    mask: torch.Tensor | None  # [q, S] bool; None (with slot_index None) = plain causal


@dataclass
class WindowView:
    decode: DecodeRows | None
    prefills: list[PrefillRow]


class CpuAttentionMetadata:
    def __init__(self, batch: AttentionBatch):
        self.batch = batch
        self.slot_mapping = batch.slot_mapping
        self._views: dict[int | None, WindowView] = {}

    def view(self, window: int | None) -> WindowView:
        if window not in self._views:
            self._views[window] = WindowView(self._decode_rows(window), self._prefill_rows(window))
        return self._views[window]

    def _decode_rows(self, window: int | None) -> DecodeRows | None:
        b = self.batch
        num_rows = b.num_decode_rows
        if num_rows == 0:
            return None
        seq_lens = torch.tensor(b.start_positions[:num_rows]) + 1  # [B]
        first = (seq_lens - window).clamp(min=0) if window else torch.zeros_like(seq_lens)  # [B]
        kv_lens = seq_lens - first  # [B]
        max_len = int(kv_lens.max())
        offsets = torch.arange(max_len)  # [L]
        valid = offsets < kv_lens.unsqueeze(1)  # [B, L]
        positions = torch.where(valid, first.unsqueeze(1) + offsets, 0)  # [B, L]
        num_blocks = -(-int(seq_lens.max()) // b.block_size)
        tables = torch.tensor(
            [_padded(t[:num_blocks], num_blocks) for t in b.block_tables[:num_rows]]
        )  # [B, num_blocks]
        slots = (
            tables.gather(1, positions // b.block_size) * b.block_size + positions % b.block_size
        )
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        return DecodeRows(slots, mask)

    def _prefill_rows(self, window: int | None) -> list[PrefillRow]:
        b = self.batch
        rows = []
        for i in range(b.num_decode_rows, b.num_rows):
            start, num_q, start_pos = b.query_starts[i], b.num_queries[i], b.start_positions[i]
            end_pos = start_pos + num_q
            if start_pos == 0 and (window is None or num_q <= window):
                rows.append(PrefillRow(start, start + num_q, None, None))
                continue
            first = 0 if window is None else max(0, start_pos - window + 1)
            key_pos = torch.arange(first, end_pos)  # [S]
            query_pos = torch.arange(start_pos, end_pos).unsqueeze(1)  # [q, 1]
            mask = key_pos <= query_pos  # [q, S]
            if window is not None:
                mask &= query_pos - key_pos < window
            slots = None
            if start_pos > 0:
                table = torch.tensor(b.block_tables[i][: -(-end_pos // b.block_size)])
                slots = table[key_pos // b.block_size] * b.block_size + key_pos % b.block_size
            rows.append(PrefillRow(start, start + num_q, slots, mask))
        return rows


def _padded(table: list[int], length: int) -> list[int]:
    return table + [0] * (length - len(table))


class CpuAttentionBackend(AttentionBackend):
    name = "cpu-sdpa"

    def build_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        return CpuAttentionMetadata(batch)

    def kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_dim):
        return (num_blocks * block_size, num_kv_heads, head_dim)

    def forward(self, q, k, v, kv_cache, metadata: CpuAttentionMetadata, scale, sliding_window):
        k_cache, v_cache = kv_cache
        k_cache.index_copy_(0, metadata.slot_mapping, k)
        v_cache.index_copy_(0, metadata.slot_mapping, v)
        view = metadata.view(sliding_window)
        outs = []
        if view.decode is not None:
            num_decode = view.decode.slot_index.shape[0]
            outs.append(_decode(q[:num_decode], k_cache, v_cache, view.decode, scale))
        outs.extend(_prefill(q, k, v, k_cache, v_cache, row, scale) for row in view.prefills)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, D]
        return out if out.dtype == q.dtype else out.to(q.dtype)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def _decode(q, k_cache, v_cache, rows: DecodeRows, scale: float) -> torch.Tensor:
    num_rows, max_len = rows.slot_index.shape
    flat = rows.slot_index.view(-1)
    k = k_cache.index_select(0, flat).unflatten(0, (num_rows, max_len))  # [B, L, KVH, D]
    v = v_cache.index_select(0, flat).unflatten(0, (num_rows, max_len))  # [B, L, KVH, D]
    out = F.scaled_dot_product_attention(
        _fp32(q).unsqueeze(2),  # [B, H, 1, D]
        _fp32(k).transpose(1, 2),  # [B, KVH, L, D]
        _fp32(v).transpose(1, 2),
        attn_mask=rows.mask,
        scale=scale,
        enable_gqa=True,
    )  # [B, H, 1, D]
    return out.squeeze(2)  # [B, H, D]


def _prefill(q, k, v, k_cache, v_cache, row: PrefillRow, scale: float) -> torch.Tensor:
    if row.slot_index is None:
        keys, values = k[row.start : row.end], v[row.start : row.end]  # [q, KVH, D]
    else:
        keys = k_cache.index_select(0, row.slot_index)  # [S, KVH, D]
        values = v_cache.index_select(0, row.slot_index)
    out = F.scaled_dot_product_attention(
        _fp32(q[row.start : row.end]).transpose(0, 1).unsqueeze(0),  # [1, H, q, D]
        _fp32(keys).transpose(0, 1).unsqueeze(0),  # [1, KVH, S, D]
        _fp32(values).transpose(0, 1).unsqueeze(0),
        attn_mask=row.mask,
        is_causal=row.mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, H, q, D]
    return out.squeeze(0).transpose(0, 1)  # [q, H, D]
