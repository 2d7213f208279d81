"""Plain-torch references for the Triton kernels' tests: paged attention over the CUDA layout,
row by row, with every AttentionParams feature."""

from __future__ import annotations

import torch

from pytgi.backends.base import AttentionBatch, AttentionParams


def gather_keys(cache: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, bs: int):
    """cache [num_blocks, bs, KVH, D], one row's table [W], positions [S] -> [S, KVH, D]."""
    return cache[table[positions // bs], positions % bs]


def reference_attention(
    q: torch.Tensor, kv_cache, batch: AttentionBatch, params: AttentionParams
) -> torch.Tensor:
    """q [T, H, D] -> [T, H, Dv] in fp32: each query at position p attends to the cached keys
    p - W < pos <= p of its row (the step's K/V must be in the cache already)."""
    k_cache, v_cache = kv_cache
    group = params.num_heads // params.num_kv_heads
    out = torch.zeros(q.shape[0], params.num_heads, params.v_size)
    starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    for row in range(batch.num_rows):
        first, last = starts[row], starts[row + 1]
        num_q = last - first
        query_pos = torch.arange(seq_lens[row] - num_q, seq_lens[row])  # [q]
        key_pos = torch.arange(seq_lens[row])  # [S]
        table = batch.block_table[row].cpu()
        keys = gather_keys(k_cache.cpu(), table, key_pos, batch.block_size).float()  # [S, KVH, D]
        values = gather_keys(v_cache.cpu(), table, key_pos, batch.block_size).float()
        keys = keys.repeat_interleave(group, dim=1)  # [S, H, D]
        values = values.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,shd->hqs", q[first:last].float().cpu(), keys) * params.scale
        if params.logits_soft_cap:
            scores = params.logits_soft_cap * torch.tanh(scores / params.logits_soft_cap)
        distance = key_pos[None, :] - query_pos[:, None]  # [q, S]
        if params.alibi_slopes is not None:
            slopes = torch.tensor(params.alibi_slopes)[:, None, None]  # [H, 1, 1]
            scores = scores + slopes * distance
        visible = distance <= 0
        if params.sliding_window:
            visible &= distance > -params.sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[first:last] = torch.einsum("hqs,shd->qhd", scores.softmax(-1), values)
    return out
