"""Paged attention on CPU: `F.scaled_dot_product_attention` (fp32, `enable_gqa`), head-major cache.

Cache layout, per layer: K and V are each [kv_heads, num_blocks * block_size, head_dim], i.e. per
head a [num_blocks, block_size, head_dim] block array; a token's slot is block * block_size + pos %
block_size, so one `index_copy_` (along dim 1) stores a whole step's tokens. Reads gather whole
blocks: viewed as [kv_heads * num_blocks, block_size, head_dim], one `index_select` with the
per-step index head * num_blocks + block copies block_size * head_dim contiguous values per (block,
head), and the result views as [rows, kv_heads, L, head_dim] with a contiguous [L, head_dim] slice
per (row, head), which SDPA reads without a further copy. The gather writes into a buffer the
metadata keeps for the whole step, so the layers share one allocation (and its page faults) instead
of a fresh multi-MB tensor each. (Against the token-major [slots, kv_heads, head_dim] layout, whose
gather copied 768-byte chunks per token into a new tensor per layer, a SmolLM-shaped batch-16 decode
step at 256-376 tokens measured ~0.8-0.9x the time; a cold gather is memory-bound either way.)

Per step, `build_metadata` precomputes block tables and masks lazily per sliding-window value, and
gather indices per (block table, kv heads, cache size), so once per step, shared by all layers:
- decode rows (1 query token): one batched SDPA over K/V gathered from a padded [B, nb] block
  table (the row's key j is position first_block * block_size + j), with a length / window mask
  only when the rows' visible key ranges differ;
- fresh prompts (nothing cached): this step's own K/V (no cache read), through the compiled
  flash-style kernel `prefill_attention` (causal, window, GQA; head_dim % 16 == 0), else SDPA with
  is_causal (or the window mask); with the kernel, other prefill rows use its paged twin
  `prefill_attention_paged`, which reads the cached blocks in place;
- other prefill rows (chunked prefill, prefix-cache hits) without the kernel: whole blocks
  gathered from the cache, sliced to the visible keys, and an explicit bottom-right causal (and
  window) mask [q, kv] for SDPA.
Sliding window W (transformers' convention): a query at position p sees keys at p - W < pos <= p.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pytgi.backends.base import AttentionBackend, AttentionBatch
from pytgi.backends.cpu.kernels import cpu_kernels_for


@dataclass
class DecodeRows:
    blocks: torch.Tensor  # [B, nb] int64: cache blocks holding each row's visible keys (padded)
    offset: int  # the rows' keys are [offset, offset + length) of their gathered nb * block_size
    length: int
    mask: torch.Tensor | None  # [B, 1, 1, length] bool, None when every row sees all its keys
    # for the compiled kernel, which reads the cache in place: row b sees positions
    # first[b] <= p < seq_lens[b] through its whole (padded) block table
    tables: torch.Tensor  # [B, width] int64
    first: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64


@dataclass
class PrefillRow:
    start: int  # flat token range of the row's queries
    end: int
    blocks: torch.Tensor | None  # [1, nb] cache blocks of the visible keys; None = this step's K/V
    offset: int  # the keys are [offset, offset + length) of the gathered nb * block_size
    length: int
    mask: torch.Tensor | None  # [q, length] bool; None (with blocks None) = plain causal
    position: int = 0  # the position of the row's first query
    block_table: torch.Tensor | None = None  # [W] int64, the row's whole table (cached keys)


@dataclass
class WindowView:
    decode: DecodeRows | None
    prefills: list[PrefillRow]


class CpuAttentionMetadata:
    def __init__(self, batch: AttentionBatch):
        self.batch = batch
        self.slot_mapping = batch.slot_mapping
        self._views: dict[int | None, WindowView] = {}
        self._gather: dict[tuple, torch.Tensor] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}

    def view(self, window: int | None) -> WindowView:
        if window not in self._views:
            self._views[window] = WindowView(self._decode_rows(window), self._prefill_rows(window))
        return self._views[window]

    def gather_index(self, blocks: torch.Tensor, num_kv_heads: int, num_blocks: int):
        """[KVH * blocks.numel()] rows of the [KVH * num_blocks, block_size, D] cache view: head h's
        copy of every block in `blocks`, head-major. Cached per step (shared by all layers): keyed
        by the identity of `blocks`, which must be a tensor this metadata keeps alive."""
        key = (id(blocks), num_kv_heads, num_blocks)
        index = self._gather.get(key)
        if index is None:
            heads = torch.arange(num_kv_heads).unsqueeze(1) * num_blocks  # [KVH, 1]
            index = (heads + blocks.reshape(1, -1)).reshape(-1)
            self._gather[key] = index
        return index

    def gather_buffer(self, key: tuple, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A gather destination reused by every layer of the step (layers run one at a time and
        nothing keeps a gathered K/V past its layer): one allocation per step instead of a fresh
        multi-MB tensor, and its page faults, per layer."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = torch.empty(shape, dtype=dtype)
            self._buffers[key] = buffer
        return buffer

    @property
    def is_decode_only(self) -> bool:
        return self.batch.num_decode_rows == self.batch.num_rows

    @functools.cached_property
    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode rows' (block tables [B, W], seq_lens [B]), int64: row b's keys are positions
        0 <= p < seq_lens[b], in blocks tables[b, :ceil(seq_lens[b] / block_size)] (the rest is
        padding with block 0)."""
        b = self.batch
        num_rows = b.num_decode_rows
        seq_lens = torch.tensor(b.start_positions[:num_rows]) + 1  # [B]
        width = max(-(-(p + 1) // b.block_size) for p in b.start_positions[:num_rows])
        tables = torch.tensor([_padded(t, width) for t in b.block_tables[:num_rows]])  # [B, width]
        return tables, seq_lens

    def _decode_rows(self, window: int | None) -> DecodeRows | None:
        b = self.batch
        if b.num_decode_rows == 0:
            return None
        bs = b.block_size
        tables, seq_lens = self.decode_tables  # [B, width], [B]
        first = (seq_lens - window).clamp(min=0) if window else torch.zeros_like(seq_lens)  # [B]
        first_block = first // bs  # [B]
        num_blocks = int((-(-seq_lens // bs) - first_block).max())
        width = int(first_block.max()) + num_blocks  # a row's window may end in the padding
        if width > tables.shape[1]:
            tables = F.pad(tables, (0, width - tables.shape[1]))
        blocks = tables.gather(1, first_block.unsqueeze(1) + torch.arange(num_blocks))  # [B, nb]
        lo = first - first_block * bs  # [B] first visible key of the row's gathered keys
        hi = seq_lens - first_block * bs  # [B] one past its last
        offset, end = int(lo.min()), int(hi.max())
        keys = torch.arange(offset, end)  # [L]
        valid = (keys >= lo.unsqueeze(1)) & (keys < hi.unsqueeze(1))  # [B, L]
        mask = None if bool(valid.all()) else valid[:, None, None, :]
        return DecodeRows(blocks, offset, end - offset, mask, tables, first, seq_lens)

    def _prefill_rows(self, window: int | None) -> list[PrefillRow]:
        b = self.batch
        bs = b.block_size
        rows = []
        for i in range(b.num_decode_rows, b.num_rows):
            start, num_q, start_pos = b.query_starts[i], b.num_queries[i], b.start_positions[i]
            end_pos = start_pos + num_q
            if start_pos == 0 and (window is None or num_q <= window):
                rows.append(PrefillRow(start, start + num_q, None, 0, num_q, None))
                continue
            first = 0 if window is None else max(0, start_pos - window + 1)
            key_pos = torch.arange(first, end_pos)  # [S]
            query_pos = torch.arange(start_pos, end_pos).unsqueeze(1)  # [q, 1]
            mask = key_pos <= query_pos  # [q, S]
            if window is not None:
                mask &= query_pos - key_pos < window
            if start_pos == 0:  # a fresh prompt longer than the window: its own K/V, masked
                rows.append(PrefillRow(start, start + num_q, None, 0, num_q, mask))
                continue
            first_block = first // bs
            table = torch.tensor(b.block_tables[i][: -(-end_pos // bs)])  # [W]
            blocks = table[first_block:].unsqueeze(0)  # [1, nb]
            offset = first - first_block * bs
            rows.append(
                PrefillRow(
                    start, start + num_q, blocks, offset, end_pos - first, mask, start_pos, table
                )
            )
        return rows


def _padded(table: list[int], length: int) -> list[int]:
    return table[:length] + [0] * (length - len(table))


class CpuAttentionBackend(AttentionBackend):
    name = "cpu-sdpa"

    def build_metadata(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        return CpuAttentionMetadata(batch)

    def kv_cache_shape(self, num_blocks, block_size, num_kv_heads, head_dim):
        return (num_kv_heads, num_blocks * block_size, head_dim)

    def forward(self, q, k, v, kv_cache, metadata: CpuAttentionMetadata, scale, sliding_window):
        k_cache, v_cache = kv_cache  # [KVH, num_blocks * block_size, D]
        ops = cpu_kernels_for(q) if k_cache.dtype == q.dtype else None
        if ops is not None:
            ops.store_kv(k, v, k_cache, v_cache, metadata.slot_mapping)
        else:
            k_cache.index_copy_(1, metadata.slot_mapping, k.transpose(0, 1).to(k_cache.dtype))
            v_cache.index_copy_(1, metadata.slot_mapping, v.transpose(0, 1).to(v_cache.dtype))
        view = metadata.view(sliding_window)
        bs = metadata.batch.block_size
        outs = []
        if view.decode is not None:
            rows = view.decode
            num_decode = rows.blocks.shape[0]
            if ops is not None:  # reads the paged cache in place: no gather, no mask
                outs.append(
                    ops.decode_attention(
                        q[:num_decode],
                        k_cache,
                        v_cache,
                        rows.tables,
                        rows.first,
                        rows.seq_lens,
                        bs,
                        scale,
                    )
                )
            else:
                outs.append(_decode(q[:num_decode], kv_cache, metadata, rows, bs, scale))
        outs.extend(
            _prefill(q, k, v, kv_cache, metadata, row, bs, scale, ops, sliding_window)
            for row in view.prefills
        )
        out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, D]
        return out if out.dtype == q.dtype else out.to(q.dtype)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def _gather(cache, metadata, blocks, block_size, offset, length, which: str) -> torch.Tensor:
    """cache [KVH, num_blocks * block_size, D], blocks [R, nb] -> [R, KVH, length, D] (fp32),
    each (row, head) slice contiguous. `which` ("k"/"v") picks the step's reused buffer."""
    kvh, num_slots, d = cache.shape
    num_blocks = num_slots // block_size
    index = metadata.gather_index(blocks, kvh, num_blocks)  # [KVH * R * nb]
    rows, nb = blocks.shape
    out = metadata.gather_buffer(
        (id(blocks), which), (index.numel(), block_size, d), cache.dtype
    )  # [KVH * R * nb, bs, D]
    torch.index_select(cache.view(kvh * num_blocks, block_size, d), 0, index, out=out)
    out = out.view(kvh, rows, nb * block_size, d)[:, :, offset : offset + length]
    return _fp32(out.transpose(0, 1))  # [R, KVH, length, D]


def _decode(q, kv_cache, metadata, rows: DecodeRows, block_size, scale) -> torch.Tensor:
    k, v = (
        _gather(c, metadata, rows.blocks, block_size, rows.offset, rows.length, which)
        for c, which in zip(kv_cache, "kv", strict=True)
    )  # [B, KVH, L, D]
    out = F.scaled_dot_product_attention(
        _fp32(q).unsqueeze(2),  # [B, H, 1, D]
        k,
        v,
        attn_mask=rows.mask,
        scale=scale,
        enable_gqa=True,
    )  # [B, H, 1, D]
    return out.squeeze(2)  # [B, H, D]


def _prefill(
    q, k, v, kv_cache, metadata, row: PrefillRow, block_size, scale, ops, window
) -> torch.Tensor:
    rows = slice(row.start, row.end)
    if ops is not None and q.shape[-1] % 16 == 0:
        # the compiled flash-style kernel, which skips the blocks above the diagonal (1.2-1.9x
        # SDPA's fp32 CPU kernel, docs/PERFORMANCE.md): a fresh prompt reads its own K/V, a
        # later chunk or a prefix hit the paged cache (this step's K/V are stored already)
        if row.blocks is None:
            return ops.prefill_attention(q[rows], k[rows], v[rows], scale, window or 0)
        k_cache, v_cache = kv_cache
        return ops.prefill_attention_paged(
            q[rows], k_cache, v_cache, row.block_table, row.position, block_size, scale, window or 0
        )  # [q, H, D]
    if row.blocks is None:
        keys = _fp32(k[row.start : row.end]).transpose(0, 1).unsqueeze(0)  # [1, KVH, q, D]
        values = _fp32(v[row.start : row.end]).transpose(0, 1).unsqueeze(0)
    else:
        keys, values = (
            _gather(c, metadata, row.blocks, block_size, row.offset, row.length, which)
            for c, which in zip(kv_cache, "kv", strict=True)
        )  # [1, KVH, S, D]
    out = F.scaled_dot_product_attention(
        _fp32(q[row.start : row.end]).transpose(0, 1).unsqueeze(0),  # [1, H, q, D]
        keys,
        values,
        attn_mask=row.mask,
        is_causal=row.mask is None,
        scale=scale,
        enable_gqa=True,
    )  # [1, H, q, D]
    return out.squeeze(0).transpose(0, 1)  # [q, H, D]
