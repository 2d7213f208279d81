"""Paged attention on CPU: the compiled kernels (decode rows read the paged cache in place,
flash-style prefill), else `F.scaled_dot_product_attention` (fp32, `enable_gqa`) over gathered
blocks. Head-major block cache.

Cache layout, per layer: K and V are each [kv_heads, num_blocks * block_size, head_dim], i.e. per
head a [num_blocks, block_size, head_dim] block array; a token's slot is block * block_size + pos %
block_size, so one `index_copy_` (along dim 1) stores a whole step's tokens. The torch path reads
whole blocks: viewed as [kv_heads * num_blocks, block_size, head_dim], one `index_select` with the
per-step index head * num_blocks + block copies block_size * head_dim contiguous values per (block,
head), and the result views as [rows, kv_heads, L, head_dim] with a contiguous [L, head_dim] slice
per (row, head), which SDPA reads without a further copy. The gather writes into a buffer the
metadata keeps for the whole step, so the layers share one allocation.

`CpuMetadataBuilder.build` computes everything before the forward, once per step and per sliding
window value among the layers, shared by all layers:
- decode rows (1 query token): the compiled `decode_attention` reads K/V from the block table in
  place; the torch path runs one batched SDPA over K/V gathered from a padded [B, nb] block table
  (the row's key j is position first_block * block_size + j), with a length / window mask only
  when the rows' visible key ranges differ;
- fresh prompts (nothing cached): this step's own K/V (no cache read), through the compiled
  flash-style kernel `prefill_attention` (causal, window, GQA; head_dim % 16 == 0), else SDPA with
  is_causal (or the window mask); with the kernel, other prefill rows use its paged twin
  `prefill_attention_paged`, which reads the cached blocks in place;
- a row with bidirectional spans (`AttentionBatch.bidirectional_spans`: PaliGemma's prompt,
  Gemma 3's images): the torch path (the kernels are causal) with the mask
  (causal & window) | same-span, as transformers ORs its token-type mask over the (sliding)
  causal one; its own K/V for a fresh row, else the cached keys as for other prefill rows;
- other prefill rows (chunked prefill, prefix-cache hits) without the kernel: whole blocks
  gathered from the cache, sliced to the visible keys, and an explicit bottom-right causal (and
  window) mask [q, kv] for SDPA.
KV groups (a model mixing windowed and full layers, docs/KV_CACHE.md): each group's layers have
caches of the group's block count, and each request a block table per group; a view (one per
window value) is built over its group's table and slots (`AttentionBatch.group`), so a layer
stores at and reads through its own group's blocks only.
Sliding window W (transformers' convention): a query at position p sees keys at p - W < pos <= p.
Chunked attention C (Llama 4): a query at p sees keys p // C * C <= pos <= p; decode rows start
their keys at their chunk, prefill rows are cut at chunk boundaries (`_chunked_prefills`), and a
piece continuing a chunk from the cache runs on the compiled path as decode rows.

Narrow caches (`--kv-cache-dtype`: fp8_e4m3fn, fp8_e5m2, bfloat16, float16, int8 below an fp32
or 16-bit model): a token's K is stored as k / k_scale clamped to the cache dtype's finite range
and read back as stored * k_scale in fp32 (likewise V; the scales are the layer's per-tensor
checkpoint scales for fp8_e4m3fn, as TGI applies them, else 1.0); an int8 cache row holds the
head's head_dim int8 values and then its own fp32 scale (max |x| / 127 of that token and head),
so its rows are head_dim + 4 bytes wide. The compiled kernels write and read every format in
place (csrc/attention.h: each key and value converted as the kernel reads it); the torch path
gathers the visible blocks in the narrow dtype and widens only them. A fresh prompt attends to
its own K/V after the same round trip (the kernels: through the paged prefill kernel over the
rows just stored), so every query sees exactly the values the cache holds: a row's output does
not depend on whether its keys came from this step or an earlier one (chunked prefill, prefix
hits, preemption), nor on the batch.

Score modifiers, fixed per layer: logit soft-capping (Gemma 2: s -> cap * tanh(s / cap), after the
scale) and ALiBi (a per-head bias slope * (key position - query position), added after the cap).
The compiled kernels take both; the torch path runs them as an explicit softmax over the scores
(`_modified_attention`) instead of SDPA, which has no hook for either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pytgi.backends.base import (
    FP8_DTYPES,
    INT8_KV_SCALE_BYTES,
    AttentionBackend,
    AttentionBatch,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionParams,
    KVCache,
    KVCacheSpec,
    KVScales,
    LatentAttentionSpec,
    kv_group_of,
    kv_group_windows,
)
from pytgi.errors import ModelLoadError
from pytgi.utils.math import cdiv

KERNEL_HEAD_MULTIPLE = 16  # the prefill kernels' register tiles
# Row invariance (docs/KERNELS.md): a continuation of at most this many queries (a verify step's
# k + 1 rows with --speculate k, a short chunk) runs each query as a decode row of the compiled
# decode kernel, so its numbers are a decode row's bit for bit; longer chunks take the flash
# kernel (equal in exact arithmetic, not in every bit)
DECODE_LIKE_ROWS = 8


@dataclass
class DecodeRows:
    # for the compiled kernel, which reads the cache in place: row b sees positions
    # first[b] <= p < seq_lens[b] through its whole (padded) block table
    tables: torch.Tensor  # [B, W] int64
    first: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64
    # for the torch path (None with the kernels)
    blocks: torch.Tensor | None = None  # [B, nb]: cache blocks holding each row's visible keys
    offset: int = 0  # the rows' keys are [offset, offset + length) of their gathered blocks
    length: int = 0
    mask: torch.Tensor | None = None  # [B, 1, 1, length] bool, None when every row sees all


@dataclass
class PrefillRow:
    start: int  # flat token range of the row's queries
    end: int
    blocks: torch.Tensor | None  # [1, nb] cache blocks of the visible keys; None = this step's K/V
    offset: int  # the keys are [offset, offset + length) of the gathered nb * block_size
    length: int
    mask: torch.Tensor | None  # [q, length] bool; None (with blocks None) = plain causal
    position: int = 0  # the position of the row's first query
    # [W] int64, the row's whole table (cached keys; for a fresh row its own, just stored); None
    # for a chunked layer's piece that starts its chunk (its positions count from the chunk)
    block_table: torch.Tensor | None = None
    bidirectional: bool = False  # its mask opens bidirectional spans (torch path only)
    # chunked attention: the first key every query of the row sees (its chunk's start), when
    # that is a cached key (the compiled path then runs the queries as decode rows)
    chunk_start: int | None = None


@dataclass
class WindowView:
    decode: DecodeRows | None
    prefills: list[PrefillRow]
    # the view's KV group (AttentionBatch.group): the cache slot of each new token [T], and
    # the blocks in each of the group's layer caches
    slot_mapping: torch.Tensor | None = None
    num_blocks: int = 0


class CpuAttentionMetadata:
    """One step's attention metadata, all of it built before the forward."""

    def __init__(self, batch: AttentionBatch, views: dict[tuple, WindowView], gathers):
        self.batch = batch
        self.slot_mapping = batch.slot_mapping  # [T]
        self.block_size = batch.block_size
        self.views = views  # by `view_key`: the sliding window (None: full), ("chunk", C)
        self.gather_index = gathers  # (id(blocks), kv heads) -> [KVH * blocks.numel()] int64
        self._buffers: dict[tuple, torch.Tensor] = {}

    @property
    def is_decode_only(self) -> bool:
        return self.batch.is_decode_only

    @property
    def decode_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode rows' (block tables [B, W], seq_lens [B]): row b's keys are positions
        0 <= p < seq_lens[b], in blocks tables[b, :ceil(seq_lens[b] / block_size)]."""
        num_rows = self.batch.num_decode_rows
        return self.batch.block_table[:num_rows], self.batch.seq_lens[:num_rows]

    def gather_buffer(self, key: tuple, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A gather destination reused by every layer of the step (layers run one at a time and
        nothing keeps a gathered K/V past its layer)."""
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != shape or buffer.dtype != dtype:
            buffer = torch.empty(shape, dtype=dtype)
            self._buffers[key] = buffer
        return buffer


class CpuMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, specs: Iterable[KVCacheSpec], num_blocks: int | tuple[int, ...], kernels):
        specs = list(specs)
        self.visibilities = sorted(
            {s.visibility for s in specs}, key=lambda v: (v[0] or 0, v[1] or 0)
        )
        self.kv_heads = sorted({s.num_kv_heads for s in specs})
        # one count: one KV group; else one per group of kv_group_windows(specs)
        self.group_blocks = num_blocks if isinstance(num_blocks, tuple) else (num_blocks,)
        self.groups = kv_group_windows(specs) if len(self.group_blocks) > 1 else (None,)
        self.num_blocks = self.group_blocks[0]
        self.kernels = kernels
        kernel_prefill = all(s.head_size % KERNEL_HEAD_MULTIPLE == 0 for s in specs)
        self.torch_decode = kernels is None  # the kernels read every cache format in place
        self.torch_prefill = self.torch_decode or not kernel_prefill

    def build(self, batch: AttentionBatch) -> CpuAttentionMetadata:
        views = {}
        for w, c in self.visibilities:
            group = kv_group_of(w, self.groups)
            seen = batch.group(group)  # the group's block table and slots
            views[view_key(w, c)] = WindowView(
                self._decode_rows(seen, w, c),
                self._prefills(seen, w, c),
                seen.slot_mapping,
                self.group_blocks[group],
            )
        gathers = {}
        for view in views.values():
            groups = [view.decode.blocks] if view.decode and view.decode.blocks is not None else []
            groups += [row.blocks for row in view.prefills if row.blocks is not None
                       and (self.torch_prefill or row.bidirectional)]  # fmt: skip
            for blocks in groups:
                for kvh in self.kv_heads:
                    gathers[(id(blocks), kvh)] = self._gather_index(blocks, kvh, view.num_blocks)
        return CpuAttentionMetadata(batch, views, gathers)

    @staticmethod
    def _gather_index(blocks: torch.Tensor, num_kv_heads: int, num_blocks: int) -> torch.Tensor:
        """[KVH * blocks.numel()] rows of the [KVH * num_blocks, block_size, D] cache view: head
        h's copy of every block in `blocks`, head-major."""
        heads = torch.arange(num_kv_heads).unsqueeze(1) * num_blocks  # [KVH, 1]
        return (heads + blocks.reshape(1, -1)).reshape(-1)

    def _decode_rows(
        self, batch: AttentionBatch, window: int | None, chunk: int | None = None
    ) -> DecodeRows | None:
        if batch.num_decode_rows == 0:
            return None
        bs = batch.block_size
        num_rows = batch.num_decode_rows
        tables, seq_lens = batch.block_table[:num_rows], batch.seq_lens[:num_rows]  # [B, W], [B]
        first = _first_visible(seq_lens, window, chunk)  # [B]
        rows = DecodeRows(tables, first, seq_lens)
        if not self.torch_decode:
            return rows
        first_block = first // bs  # [B]
        num_blocks = int((-(-seq_lens // bs) - first_block).max())
        width = int(first_block.max()) + num_blocks  # a row's window may end in the padding
        if width > tables.shape[1]:
            tables = F.pad(tables, (0, width - tables.shape[1]))
        rows.blocks = tables.gather(1, first_block.unsqueeze(1) + torch.arange(num_blocks))
        lo = first - first_block * bs  # [B] first visible key of the row's gathered keys
        hi = seq_lens - first_block * bs  # [B] one past its last
        rows.offset, end = int(lo.min()), int(hi.max())
        keys = torch.arange(rows.offset, end)  # [L]
        valid = (keys >= lo.unsqueeze(1)) & (keys < hi.unsqueeze(1))  # [B, L]
        rows.length = end - rows.offset
        rows.mask = None if bool(valid.all()) else valid[:, None, None, :]
        return rows

    def _prefills(
        self, batch: AttentionBatch, window: int | None, chunk: int | None = None
    ) -> list[PrefillRow]:
        if chunk is not None:
            return self._chunked_prefills(batch, chunk)
        bs = batch.block_size
        starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
        spans = batch.bidirectional_spans or ((),) * batch.num_rows
        rows = []
        for i in range(batch.num_decode_rows, batch.num_rows):
            start, num_q = starts[i], starts[i + 1] - starts[i]
            end_pos = seq_lens[i]
            start_pos = end_pos - num_q
            table = batch.block_table[i, : cdiv(end_pos, bs)]  # [W]
            if start_pos == 0 and not spans[i] and (window is None or num_q <= window):
                rows.append(PrefillRow(start, start + num_q, None, 0, num_q, None,
                                       block_table=table))  # fmt: skip
                continue
            first = 0 if window is None else max(0, start_pos - window + 1)
            key_pos = torch.arange(first, end_pos)  # [S]
            query_pos = torch.arange(start_pos, end_pos).unsqueeze(1)  # [q, 1]
            mask = key_pos <= query_pos  # [q, S]
            if window is not None:
                mask &= query_pos - key_pos < window
            for lo, hi in spans[i]:  # opened both ways over each span (inside the row's queries)
                mask[lo - start_pos : hi - start_pos, lo - first : hi - first] = True
            bidirectional = bool(spans[i])
            if start_pos == 0:  # its own K/V, masked (longer than the window, or spans)
                rows.append(PrefillRow(start, start + num_q, None, 0, num_q, mask,
                                       block_table=table, bidirectional=bidirectional))  # fmt: skip
                continue
            first_block = first // bs
            rows.append(
                PrefillRow(
                    start,
                    start + num_q,
                    table[first_block:].unsqueeze(0),  # [1, nb]
                    first - first_block * bs,
                    end_pos - first,
                    mask,
                    start_pos,
                    table,
                    bidirectional=bidirectional,
                )
            )
        return rows

    def _chunked_prefills(self, batch: AttentionBatch, chunk: int) -> list[PrefillRow]:
        """Chunked attention: each row split where its queries cross a chunk boundary, so every
        piece's queries share one chunk. A piece that starts its chunk sees only its own K/V
        (plain causal, like a fresh prompt); a piece that continues a chunk sees the cached keys
        from the chunk's start, bottom-right causal."""
        bs = batch.block_size
        starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
        rows = []
        for i in range(batch.num_decode_rows, batch.num_rows):
            end_pos = seq_lens[i]
            start_pos = position = end_pos - (starts[i + 1] - starts[i])
            while position < end_pos:
                first = position // chunk * chunk
                piece_end = min(end_pos, first + chunk)
                flat = starts[i] + position - start_pos  # the piece's first flat token
                num_q = piece_end - position
                if position == first:  # its own K/V (keys from position `first` as 0)
                    rows.append(PrefillRow(flat, flat + num_q, None, 0, num_q, None))
                else:
                    key_pos = torch.arange(first, piece_end)  # [S]
                    query_pos = torch.arange(position, piece_end).unsqueeze(1)  # [q, 1]
                    table = batch.block_table[i, : cdiv(piece_end, bs)]  # [W]
                    first_block = first // bs
                    rows.append(
                        PrefillRow(
                            flat,
                            flat + num_q,
                            table[first_block:].unsqueeze(0),  # [1, nb]
                            first - first_block * bs,
                            piece_end - first,
                            key_pos <= query_pos,  # [q, S]
                            position,
                            table,
                            chunk_start=first,
                        )
                    )
                position = piece_end
        return rows


def view_key(window: int | None, chunk: int | None):
    """A layer's view of the step's metadata: its sliding window (None: full attention), or
    ("chunk", C) for chunked attention."""
    return window if chunk is None else ("chunk", chunk)


def _first_visible(seq_lens: torch.Tensor, window: int | None, chunk: int | None) -> torch.Tensor:
    """The first key a query at position seq_lens - 1 sees: [B] int64."""
    if chunk is not None:
        return (seq_lens - 1) // chunk * chunk
    if window:
        return (seq_lens - window).clamp(min=0)
    return torch.zeros_like(seq_lens)


class CpuAttentionImpl(AttentionImpl):
    def __init__(self, params: AttentionParams, kernels):
        super().__init__(params)
        # the kernels write and read every cache format (the backend gets kernels for fp32 models)
        self.kernels = kernels
        self.narrow = params.kv_cache_dtype not in (None, torch.float32)
        self.scale = params.scale
        self.window = params.sliding_window
        self.chunk = params.attention_chunk_size
        self.view_key = view_key(*params.visibility)
        self.kernel_prefill = kernels is not None and params.head_size % KERNEL_HEAD_MULTIPLE == 0
        self.softcap = params.logits_soft_cap or 0.0  # 0: none (the kernels' convention)
        self.alibi = None  # [H] fp32
        if params.alibi_slopes is not None:
            self.alibi = torch.tensor(params.alibi_slopes, dtype=torch.float32)
        self.modified = self.softcap > 0 or self.alibi is not None
        self.scales = KVScales()  # applied (fp8_e4m3fn caches only)

    def set_kv_scales(self, scales: KVScales) -> None:
        super().set_kv_scales(scales)
        if self.params.kv_cache_dtype == torch.float8_e4m3fn:
            self.scales = scales

    def forward(self, q, k, v, kv_cache: KVCache, metadata: CpuAttentionMetadata):
        k_cache, v_cache = kv_cache  # [KVH, num_blocks * block_size, D]
        ops = self.kernels
        view = metadata.views[self.view_key]
        slots = view.slot_mapping  # the layer's KV group's
        if ops is not None:
            ops.store_kv(k, v, k_cache, v_cache, slots, *self._scale_pair())
        else:
            _store(k_cache, slots, _encode(k.transpose(0, 1), k_cache.dtype, self.scales.k_scale))
            _store(v_cache, slots, _encode(v.transpose(0, 1), v_cache.dtype, self.scales.v_scale))
        outs = []
        if view.decode is not None:
            outs.append(self._decode(q[: view.decode.seq_lens.shape[0]], kv_cache, metadata, ops))
        outs.extend(self._prefill(q, k, v, kv_cache, metadata, row, ops) for row in view.prefills)
        out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, D]
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _decode(self, q, kv_cache, metadata, ops) -> torch.Tensor:
        rows = metadata.views[self.view_key].decode
        if ops is not None:  # reads the paged cache in place: no gather, no mask
            k_cache, v_cache = kv_cache
            return ops.decode_attention(
                q,
                k_cache,
                v_cache,
                rows.tables,
                rows.first,
                rows.seq_lens,
                metadata.block_size,
                self.scale,
                self.softcap,
                self.alibi,
                *self._scale_pair(),
            )  # [B, H, D]
        k, v = (
            _gather(c, metadata, rows.blocks, rows.offset, rows.length, which, scale)
            for c, which, scale in zip(kv_cache, "kv", self._scale_pair(), strict=True)
        )  # [B, KVH, L, D]
        if self.modified:
            # every row's query is its last visible key's position: relative positions up to a
            # per-row constant, which the softmax ignores
            return self._modified(_fp32(q).unsqueeze(2), k, v, rows.mask).squeeze(2)  # [B, H, D]
        out = F.scaled_dot_product_attention(
            _fp32(q).unsqueeze(2),  # [B, H, 1, D]
            k,
            v,
            attn_mask=rows.mask,
            scale=self.scale,
            enable_gqa=True,
        )  # [B, H, 1, D]
        return out.squeeze(2)  # [B, H, D]

    def _prefill(self, q, k, v, kv_cache, metadata, row: PrefillRow, ops) -> torch.Tensor:
        rows = slice(row.start, row.end)
        if ops is not None and row.block_table is not None and not row.bidirectional:
            # the paged prefill kernel starts its keys at 0 or a window, never a chunk's start
            if row.end - row.start <= DECODE_LIKE_ROWS or row.chunk_start is not None:
                return self._as_decode_rows(q[rows], kv_cache, metadata, row, ops)
        if ops is not None and self.kernel_prefill and not row.bidirectional:
            # the compiled flash-style kernel, which skips the blocks above the diagonal: a fresh
            # prompt reads its own K/V (a narrow cache's: the rows just stored, as the cache
            # holds them), a later chunk or a prefix hit the paged cache (this step's K/V are
            # stored already)
            k_cache, v_cache = kv_cache
            if row.blocks is None and not (self.narrow and row.block_table is not None):
                keys, values = k[rows], v[rows]  # [q, KVH, D]
                if self.narrow:  # a chunked layer's piece: its K/V as the cache holds them
                    keys = _as_stored(keys, k_cache.dtype, self.scales.k_scale)
                    values = _as_stored(values, v_cache.dtype, self.scales.v_scale)
                return ops.prefill_attention(
                    q[rows],
                    keys,
                    values,
                    self.scale,
                    self.window or 0,
                    self.softcap,
                    self.alibi,
                )
            return ops.prefill_attention_paged(
                q[rows],
                k_cache,
                v_cache,
                row.block_table,
                row.position,
                metadata.block_size,
                self.scale,
                self.window or 0,
                self.softcap,
                self.alibi,
                *self._scale_pair(),
            )  # [q, H, D]
        if row.blocks is None:  # this step's K/V, as the cache holds them
            k_cache, v_cache = kv_cache
            keys = _as_stored(k[rows], k_cache.dtype, self.scales.k_scale)  # [q, KVH, D] fp32
            values = _as_stored(v[rows], v_cache.dtype, self.scales.v_scale)
            keys, values = keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)
        else:
            keys, values = (
                _gather(c, metadata, row.blocks, row.offset, row.length, which, scale)
                for c, which, scale in zip(kv_cache, "kv", self._scale_pair(), strict=True)
            )  # [1, KVH, S, D]
        queries = _fp32(q[rows]).transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
        if self.modified:
            mask = row.mask if row.mask is not None else _causal(row.end - row.start)
            return self._modified(queries, keys, values, mask).squeeze(0).transpose(0, 1)
        out = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            attn_mask=row.mask,
            is_causal=row.mask is None,
            scale=self.scale,
            enable_gqa=True,
        )  # [1, H, q, D]
        return out.squeeze(0).transpose(0, 1)  # [q, H, D]

    def _scale_pair(self) -> tuple[float, float]:
        return self.scales.k_scale, self.scales.v_scale

    def _as_decode_rows(self, q, kv_cache, metadata, row: PrefillRow, ops) -> torch.Tensor:
        """q [n, H, D], the queries of a continuation at positions row.position.., each as a
        decode row that sees the keys up to its own position -> [n, H, D]."""
        n = q.shape[0]
        seq_lens = row.position + 1 + torch.arange(n, dtype=torch.int64)  # [n]
        first = _first_visible(seq_lens, self.window, self.chunk)  # [n]
        tables = row.block_table.to(torch.int64).unsqueeze(0).expand(n, -1).contiguous()  # [n, W]
        k_cache, v_cache = kv_cache
        return ops.decode_attention(
            q.contiguous(), k_cache, v_cache, tables, first, seq_lens, metadata.block_size,
            self.scale, self.softcap, self.alibi, *self._scale_pair(),
        )  # fmt: skip

    def _modified(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """Soft-capped and/or ALiBi attention as an explicit softmax: q [R, H, n, D], k / v
        [R, KVH, S, D], mask [R or 1, 1, n, S] or [n, S] bool (True = visible) or None -> [R, H,
        n, D]. The query at row i sits at key position i + S - n (the bottom-right alignment
        every caller's mask has)."""
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [R, H, n, S]
        if self.softcap > 0:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        n, length = scores.shape[-2:]
        if self.alibi is not None:
            distance = torch.arange(length) - torch.arange(length - n, length).unsqueeze(1)
            scores = scores + self.alibi[:, None, None] * distance  # [H, n, S] bias
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(scores.softmax(-1), v)  # [R, H, n, D]


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()  # [n, n]


class CpuAttentionBackend(AttentionBackend):
    name = "cpu-paged"
    supports_bidirectional_spans = True
    supports_kv_groups = True

    def __init__(self, kernels=None):
        self.kernels = kernels

    def make_impl(self, params: AttentionParams) -> CpuAttentionImpl:
        if params.v_size != params.head_size:
            raise ModelLoadError(
                f"the {self.name} attention backend does not support head_size_v != head_size"
            )
        if params.alibi_slopes is not None and len(params.alibi_slopes) != params.num_heads:
            raise ModelLoadError("alibi_slopes must have one slope per query head")
        if params.logits_soft_cap is not None and params.logits_soft_cap <= 0:
            raise ModelLoadError("logits_soft_cap must be positive")
        if params.attention_chunk_size is not None and params.sliding_window is not None:
            raise ModelLoadError("a layer with both a sliding window and attention chunks")
        return CpuAttentionImpl(params, self.kernels)

    def allocate_kv_cache(self, spec: KVCacheSpec, num_blocks, block_size, device) -> KVCache:
        if isinstance(spec, LatentAttentionSpec):  # one vector per token (layers/latent_attention)
            if spec.dtype == torch.int8:
                raise ModelLoadError(
                    "--kv-cache-dtype int8 is not supported for latent (MLA) caches"
                )
            return (torch.zeros(num_blocks * block_size, spec.head_size, dtype=spec.dtype),)
        row = spec.head_size + (INT8_KV_SCALE_BYTES if spec.dtype == torch.int8 else 0)
        shape = (spec.num_kv_heads, num_blocks * block_size, row)
        return (
            torch.zeros(shape, dtype=spec.dtype, device=device),
            torch.zeros(shape, dtype=spec.dtype, device=device),
        )

    def metadata_builder(self, specs, num_blocks, block_size: int) -> CpuMetadataBuilder:
        return CpuMetadataBuilder(specs, num_blocks, self.kernels)


def _fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.float()


def _encode(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x [..., D] (any float dtype) -> x / scale in the cache's `dtype`, clamped to its finite
    range (a value past an 8- or 16-bit format's range saturates instead of becoming inf or NaN);
    int8: [..., D + 4], round(x / s) then s (fp32 bytes), s = max |x| / 127 over the row."""
    if x.dtype == dtype:
        return x
    if dtype == torch.int8:
        x = x.float()
        s = x.abs().amax(-1, keepdim=True) / 127  # [..., 1]
        q = torch.where(s > 0, x / s, 0.0).round().clamp(-127, 127).to(torch.int8)
        return torch.cat([q, s.view(torch.int8)], dim=-1)
    if dtype == torch.float32 and scale == 1.0:
        return x.to(dtype)  # exact
    limit = torch.finfo(dtype).max
    x = x.float() / scale if scale != 1.0 else x.float()
    return x.clamp(-limit, limit).to(dtype)


def _store(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache [KVH, S, row] <- x [KVH, T, row] at slots [T] (fp8 through a byte view: index_copy_
    has no fp8 kernel on CPU)."""
    if cache.dtype in FP8_DTYPES:
        cache, x = cache.view(torch.uint8), x.view(torch.uint8)
    cache.index_copy_(1, slots, x)


def _decode(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Stored rows [..., row] -> fp32 values [..., D] (times the layer's scale; int8: times each
    row's own scale)."""
    if x.dtype == torch.int8:
        s = x[..., -INT8_KV_SCALE_BYTES:].contiguous().view(torch.float32)  # [..., 1]
        return x[..., :-INT8_KV_SCALE_BYTES].float() * s
    x = _fp32(x)
    return x if scale == 1.0 else x * scale


def _as_stored(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """x as a read from a cache of `dtype` returns it, in fp32: the round trip through the
    cache's format (x itself when the cache holds x's dtype)."""
    if x.dtype == dtype:
        return _fp32(x)
    return _decode(_encode(x, dtype, scale), scale)


def _gather(cache, metadata, blocks, offset, length, which: str, scale: float) -> torch.Tensor:
    """cache [KVH, num_blocks * block_size, row], blocks [R, nb] -> [R, KVH, length, D] (fp32,
    times `scale`; row = D, or D + 4 for int8), each (row, head) slice contiguous. `which`
    ("k"/"v") picks the step's reused buffer."""
    kvh, num_slots, d = cache.shape
    block_size = metadata.block_size
    index = metadata.gather_index[(id(blocks), kvh)]  # [KVH * R * nb]
    rows, nb = blocks.shape
    out = metadata.gather_buffer(
        (id(blocks), which), (index.numel(), block_size, d), cache.dtype
    )  # [KVH * R * nb, bs, D]
    torch.index_select(
        cache.view(kvh * (num_slots // block_size), block_size, d), 0, index, out=out
    )
    out = out.view(kvh, rows, nb * block_size, d)[:, :, offset : offset + length]
    return _decode(out.transpose(0, 1), scale)  # [R, KVH, length, D]
