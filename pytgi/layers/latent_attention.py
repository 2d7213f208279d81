"""Multi-head latent attention's cache and attention (DeepSeek-V2/V3), in torch on any device.

The paged cache holds one vector per token, `[latent (kv_lora_rank) | rotary key (rope dim)]`
(a `LatentAttentionSpec`: [num_blocks * block_size, kv_lora_rank + rope_dim] per layer), instead
of every head's K and V. Attention runs in the latent space with the up-projections absorbed
by the caller (models/mla.py): each head's query is [q_nope @ W_UK | q_rope] and attends to the
cached vectors as keys and to their latent part as values, i.e. multi-query attention with one
shared "head" of size kv_lora_rank + rope_dim; the caller maps the [H, kv_lora_rank] outputs
through W_UV. That is the same attention as transformers' expanded form (q_nope . (W_UK c) +
q_rope . k_rope = (q_nope W_UK) . c + q_rope . k_rope), up to float rounding.

Per step (`LatentPlan`, built once from the step's `AttentionBatch` and shared by the layers):
the cache slots of every visible key, decode rows padded to their longest row with a validity
mask, each prefill row with its bottom-right causal mask (chunks and prefix hits read the cache,
where this step's tokens are stored first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pytgi.backends.base import AttentionBatch, AttentionParams, LatentAttentionSpec
from pytgi.layers.attention import Attention
from pytgi.layers.build_context import current_build_context
from pytgi.layers.forward_context import get_forward_context


@dataclass
class LatentPlan:
    num_decode: int
    decode_slots: torch.Tensor | None  # [B, L] int64 cache slots (padding: slot 0)
    decode_valid: torch.Tensor | None  # [B, L] bool
    # per prefill row: (first flat token, last + 1, slots [S], causal mask [q, S] bool)
    prefills: list[tuple[int, int, torch.Tensor, torch.Tensor]]


def _slots(table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """table [..., W] block ids, positions [..., L] -> cache slots [..., L]."""
    return table.gather(-1, positions // block_size) * block_size + positions % block_size


def build_plan(batch: AttentionBatch, device: torch.device) -> LatentPlan:
    bs, num_decode = batch.block_size, batch.num_decode_rows
    decode_slots = decode_valid = None
    if num_decode:
        seq_lens = batch.seq_lens[:num_decode]  # [B]
        positions = torch.arange(int(seq_lens.max())).expand(num_decode, -1)  # [B, L]
        decode_valid = positions < seq_lens.unsqueeze(1)
        table = batch.block_table[:num_decode]
        positions = positions.masked_fill(~decode_valid, 0)
        decode_slots = _slots(table, positions, bs).to(device)
        decode_valid = decode_valid.to(device)
    starts, seq_lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    prefills = []
    for i in range(num_decode, batch.num_rows):
        start, end, length = starts[i], starts[i + 1], seq_lens[i]
        keys = torch.arange(length)  # [S]
        queries = torch.arange(length - (end - start), length).unsqueeze(1)  # [q, 1]
        slots = _slots(batch.block_table[i], keys, bs)
        prefills.append((start, end, slots.to(device), (keys <= queries).to(device)))
    return LatentPlan(num_decode, decode_slots, decode_valid, prefills)


def step_plan(metadata, device: torch.device) -> LatentPlan:
    """The step's plan, built by the first latent layer and kept on the step's metadata."""
    plan = getattr(metadata, "latent_plan", None)
    if plan is None:
        plan = build_plan(metadata.batch, device)
        metadata.latent_plan = plan
    return plan


class LatentAttention(Attention):
    """Stores this step's latent vectors and attends over the latent cache (see the module
    docstring); registered with the runner like any attention layer (`kv_cache_spec`)."""

    def __init__(self, num_heads: int, kv_lora_rank: int, rope_dim: int, scale: float, *, prefix):
        nn.Module.__init__(self)  # no backend implementation: the attention is computed here
        context = current_build_context()
        self.layer_name = prefix
        self.kv_lora_rank = kv_lora_rank
        size = kv_lora_rank + rope_dim
        self.params = AttentionParams(
            num_heads=num_heads, num_kv_heads=1, head_size=size, scale=scale, head_size_v=0
        )
        self._kv_cache_spec = LatentAttentionSpec(
            num_kv_heads=1, head_size=size, head_size_v=0, dtype=context.dtype
        )

    def forward(self, query: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """query [T, H, r + dr] (absorbed), latent [T, r + dr] (this step's cache vectors) ->
        [T, H, r]: attention outputs in the latent space."""
        ctx = get_forward_context()
        (cache,) = ctx.kv_caches[self.layer_name]  # [slots, r + dr]
        metadata = ctx.attn_metadata
        cache.index_copy_(0, metadata.slot_mapping, latent.to(cache.dtype))
        plan = step_plan(metadata, cache.device)
        outs = []
        if plan.num_decode:
            keys = cache[plan.decode_slots].float()  # [B, L, r + dr]
            q = query[: plan.num_decode].float()  # [B, H, r + dr]
            scores = torch.einsum("bhd,bld->bhl", q, keys) * self.params.scale
            scores = scores.masked_fill(~plan.decode_valid.unsqueeze(1), float("-inf"))
            probs = scores.softmax(dim=-1)  # [B, H, L]
            outs.append(torch.einsum("bhl,blr->bhr", probs, keys[..., : self.kv_lora_rank]))
        for start, end, slots, mask in plan.prefills:
            keys = cache[slots].float()  # [S, r + dr]
            scores = torch.einsum("qhd,sd->hqs", query[start:end].float(), keys)
            scores = (scores * self.params.scale).masked_fill(~mask, float("-inf"))
            probs = scores.softmax(dim=-1)  # [H, q, S]
            outs.append(torch.einsum("hqs,sr->qhr", probs, keys[:, : self.kv_lora_rank]))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, r]
        return out.to(query.dtype)
