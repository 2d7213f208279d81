"""Triton kernels of the paged attention on GPU (the backend around them: attention.py).

KV cache layout, per layer: K [num_blocks, block_size, kv_heads, head_size] and V likewise with
head_size_v, i.e. a [num_slots, kv_heads, D] array where a token's slot is block * block_size +
pos % block_size. A token's K/V heads are contiguous, so the store kernel writes one row per
token, and a tile of keys is a gather of `BLOCK_N` such rows through the block table.

- `store_kv`: this step's K/V into their slots; a negative slot (the padding rows of a replayed
  CUDA graph) stores nothing.
- `decode_attention`: one query token per row, reading K/V from the blocks in place, split over
  the key range (flash-decoding): program (row, kv head, split) runs the whole GQA group of query
  heads of that KV head over its share of the row's key tiles with an online softmax, writing
  partial (acc, max, sum); a second kernel merges the splits. The number of splits depends only on
  the batch shape, never on the lengths (a captured graph replays it for any context).
- `prefill_attention`: every other row (fresh prompts, chunked prefill, prefix-cache hits) in
  tiles of `BLOCK_M` queries: program (tile, query head) reads the keys its queries see from the
  cache through the row's block table (this step's K/V are stored first), causal with the query's
  position, online softmax over `BLOCK_N`-key tiles, nothing computed past the tile's last query.

Both attend with the layer's fixed parameters: scale, sliding window W (a query at p sees keys
p - W < pos <= p), logit soft-capping (s -> cap * tanh(s / cap), after the scale), ALiBi (s +=
slope[h] * (key_pos - query_pos)), GQA (query head h reads KV head h // group). Scores and
softmax are fp32; fp32 models use IEEE fp32 dot products (no TF32), half-precision models their
dtype's tensor-core dots with fp32 accumulation. Masked scores are a large finite negative rather
than -inf, so a tile that a query cannot see yet adds exactly nothing once a visible key comes
(every query sees at least its own key), and no NaN appears.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG = tl.constexpr(-1.0e30)  # masked score (finite: see the module docstring)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    if UPCAST:  # Triton's interpreter multiplies 16-bit floats as raw integers: fp32 there
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _shape_scores(scores, softcap, slopes, distance, USE_SOFTCAP: tl.constexpr,
                  USE_ALIBI: tl.constexpr):  # fmt: skip
    """scores [M, N] fp32 (already scaled) -> soft-capped, ALiBi-biased scores. `slopes` [M, 1],
    `distance` [M, N] = key_pos - query_pos."""
    if USE_SOFTCAP:
        # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflow gives 1)
        scores = softcap * (1.0 - 2.0 / (tl.exp(2.0 * scores / softcap) + 1.0))
    if USE_ALIBI:
        scores += slopes * distance.to(tl.float32)
    return scores


@triton.jit
def store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_token_stride,
    k_head_stride,
    v_token_stride,
    v_head_stride,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token)  # int64; < 0: a padding row
    heads = tl.arange(0, BLOCK_H)[:, None]
    keep = (heads < NUM_KV_HEADS) & (heads * 0 + slot >= 0)  # [BH, 1] (a tensor, not a scalar)
    cols = tl.arange(0, BLOCK_D)[None, :]
    mask = keep & (cols < HEAD_SIZE)
    k = tl.load(k_ptr + token * k_token_stride + heads * k_head_stride + cols, mask=mask)
    k_dst = k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_SIZE) + heads * HEAD_SIZE + cols
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    cols_v = tl.arange(0, BLOCK_DV)[None, :]
    mask_v = keep & (cols_v < HEAD_SIZE_V)
    v = tl.load(v_ptr + token * v_token_stride + heads * v_head_stride + cols_v, mask=mask_v)
    v_dst = v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_SIZE_V) + heads * HEAD_SIZE_V + cols_v
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask_v)


@triton.jit(do_not_specialize=["table_stride", "num_splits"])
def decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    table_ptr,
    seq_lens_ptr,
    slopes_ptr,
    part_acc_ptr,  # [B, H, S, HEAD_SIZE_V] fp32
    part_stats_ptr,  # [B, H, S, 2] fp32: running max, sum of exponentials
    q_token_stride,
    q_head_stride,
    table_stride,
    num_splits,
    scale,
    softcap,
    BLOCK_SIZE: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + row).to(tl.int32)
    first = 0
    if WINDOW > 0:
        first = tl.maximum(seq_len - WINDOW, 0)
    num_tiles = tl.cdiv(seq_len - first, BLOCK_N)
    tiles_per_split = tl.cdiv(num_tiles, num_splits)
    tile_lo = split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, num_tiles)

    group = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + group  # [G]
    head_ok = group < GROUP
    cols = tl.arange(0, BLOCK_D)
    cols_v = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + row * q_token_stride + heads[:, None] * q_head_stride + cols[None, :],
        mask=head_ok[:, None] & (cols[None, :] < HEAD_SIZE),
        other=0.0,
    )  # [G, D]
    slopes = tl.zeros([BLOCK_G, 1], dtype=tl.float32)
    if USE_ALIBI:
        slopes = tl.load(slopes_ptr + heads, mask=head_ok, other=0.0)[:, None]
    query_pos = seq_len - 1
    m = tl.full([BLOCK_G], NEG, dtype=tl.float32)
    total = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    table = table_ptr + row * table_stride
    for tile in range(tile_lo, tile_hi):
        pos = first + tile * BLOCK_N + tl.arange(0, BLOCK_N)  # [N]
        valid = pos < seq_len
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0)
        slot = block * BLOCK_SIZE + pos % BLOCK_SIZE  # [N] int64
        k = tl.load(
            k_cache_ptr
            + slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE)
            + kv_head * HEAD_SIZE
            + cols[None, :],
            mask=valid[:, None] & (cols[None, :] < HEAD_SIZE),
            other=0.0,
        )  # [N, D]
        scores = _dot(q, tl.trans(k), IEEE, UPCAST) * scale  # [G, N]
        scores = _shape_scores(
            scores, softcap, slopes, pos[None, :] - query_pos, USE_SOFTCAP, USE_ALIBI
        )
        scores = tl.where(valid[None, :], scores, NEG)
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])  # [G, N]
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_cache_ptr
            + slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE_V)
            + kv_head * HEAD_SIZE_V
            + cols_v[None, :],
            mask=valid[:, None] & (cols_v[None, :] < HEAD_SIZE_V),
            other=0.0,
        )  # [N, DV]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)
        m = m_new
    part = (row * NUM_HEADS + heads) * num_splits + split  # [G]
    tl.store(
        part_acc_ptr + part[:, None] * HEAD_SIZE_V + cols_v[None, :],
        acc,
        mask=head_ok[:, None] & (cols_v[None, :] < HEAD_SIZE_V),
    )
    tl.store(part_stats_ptr + part * 2, m, mask=head_ok)
    tl.store(part_stats_ptr + part * 2 + 1, total, mask=head_ok)


@triton.jit(do_not_specialize=["num_splits"])
def decode_merge_kernel(
    part_acc_ptr,
    part_stats_ptr,
    out_ptr,
    out_token_stride,
    out_head_stride,
    num_splits,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    split_ok = splits < num_splits
    part = (row * NUM_HEADS + head) * num_splits + splits  # [S]
    m = tl.load(part_stats_ptr + part * 2, mask=split_ok, other=NEG)
    total = tl.load(part_stats_ptr + part * 2 + 1, mask=split_ok, other=0.0)
    weight = tl.where(split_ok, tl.exp(m - tl.max(m, axis=0)), 0.0)  # [S]
    denominator = tl.sum(total * weight, axis=0)
    cols = tl.arange(0, BLOCK_DV)
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_SIZE_V + cols[None, :],
        mask=split_ok[:, None] & (cols[None, :] < HEAD_SIZE_V),
        other=0.0,
    )  # [S, DV]
    out = tl.sum(acc * weight[:, None], axis=0) / tl.maximum(denominator, 1e-30)  # 0 if no keys
    tl.store(
        out_ptr + row * out_token_stride + head * out_head_stride + cols,
        out.to(out_ptr.dtype.element_ty),
        mask=cols < HEAD_SIZE_V,
    )


@triton.jit(do_not_specialize=["table_stride"])
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    tiles_ptr,  # [num_tiles, 4] int64: first flat token, queries, first query position, table row
    table_ptr,
    slopes_ptr,
    q_token_stride,
    q_head_stride,
    out_token_stride,
    out_head_stride,
    table_stride,
    scale,
    softcap,
    BLOCK_SIZE: tl.constexpr,
    WINDOW: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_SIZE_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    USE_ALIBI: tl.constexpr,
    IEEE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = head // GROUP
    flat_start = tl.load(tiles_ptr + tile * 4)
    num_queries = tl.load(tiles_ptr + tile * 4 + 1).to(tl.int32)
    first_pos = tl.load(tiles_ptr + tile * 4 + 2).to(tl.int32)
    table = table_ptr + tl.load(tiles_ptr + tile * 4 + 3) * table_stride

    offs_m = tl.arange(0, BLOCK_M)
    query_ok = offs_m < num_queries
    query_pos = first_pos + offs_m  # [M]
    tokens = flat_start + offs_m
    cols = tl.arange(0, BLOCK_D)
    cols_v = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + tokens[:, None] * q_token_stride + head * q_head_stride + cols[None, :],
        mask=query_ok[:, None] & (cols[None, :] < HEAD_SIZE),
        other=0.0,
    )  # [M, D]
    slopes = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if USE_ALIBI:
        slopes += tl.load(slopes_ptr + head)
    key_hi = first_pos + num_queries  # one past the tile's last query: nothing later is seen
    key_lo = 0
    if WINDOW > 0:
        key_lo = tl.maximum(first_pos - WINDOW + 1, 0)
    m = tl.full([BLOCK_M], NEG, dtype=tl.float32)
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for start in range(key_lo, key_hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)  # [N]
        key_ok = pos < key_hi
        block = tl.load(table + pos // BLOCK_SIZE, mask=key_ok, other=0)
        slot = block * BLOCK_SIZE + pos % BLOCK_SIZE
        k = tl.load(
            k_cache_ptr
            + slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE)
            + kv_head * HEAD_SIZE
            + cols[None, :],
            mask=key_ok[:, None] & (cols[None, :] < HEAD_SIZE),
            other=0.0,
        )  # [N, D]
        scores = _dot(q, tl.trans(k), IEEE, UPCAST) * scale  # [M, N]
        distance = pos[None, :] - query_pos[:, None]  # [M, N]
        scores = _shape_scores(scores, softcap, slopes, distance, USE_SOFTCAP, USE_ALIBI)
        visible = key_ok[None, :] & (distance <= 0)
        if WINDOW > 0:
            visible = visible & (distance > -WINDOW)
        scores = tl.where(visible, scores, NEG)
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_cache_ptr
            + slot[:, None] * (NUM_KV_HEADS * HEAD_SIZE_V)
            + kv_head * HEAD_SIZE_V
            + cols_v[None, :],
            mask=key_ok[:, None] & (cols_v[None, :] < HEAD_SIZE_V),
            other=0.0,
        )  # [N, DV]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)
        m = m_new
    out = acc / tl.maximum(total, 1e-30)[:, None]
    tl.store(
        out_ptr + tokens[:, None] * out_token_stride + head * out_head_stride + cols_v[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=query_ok[:, None] & (cols_v[None, :] < HEAD_SIZE_V),
    )


# kernels run by Triton's interpreter (TRITON_INTERPRET=1, CPU tests) need fp32 dots
INTERPRETED = type(prefill_kernel).__name__ == "InterpretedFunction"
