"""Paged attention on GPU with Triton kernels (triton_attention.py): the backend, one impl per
layer, and the per-step metadata.

`TritonMetadataBuilder.build` turns the step's `AttentionBatch` into device tensors before the
forward: the decode rows' block tables and lengths (used as they are when already on the device:
a CUDA graph builds its metadata over its own static buffers), the number of key splits of the
decode kernel (from the batch shape only), and for the other rows a table of query tiles. Every
layer then launches at most three kernels: store, decode (split + merge), prefill.

Why Triton rather than a maintained kernel package (flash-attn, FlashInfer, vLLM's ops): those
ship CUDA binaries built for one torch/CUDA pair and a list of GPU architectures, and none of
them runs without a GPU, so CI could not test them. Triton kernels are compiled for the device at
warm-up from Python source (the GPU image brings Triton with its torch), and the same source runs
on CPU tensors under `TRITON_INTERPRET=1`, where CI checks them against a plain-torch reference
for every feature the layers use (GQA, sliding windows, soft-capping, ALiBi, head_size_v).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import triton

from pytgi.backends.base import (
    AttentionBackend,
    AttentionBatch,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionParams,
    KVCache,
    KVCacheSpec,
    LatentAttentionSpec,
)
from pytgi.backends.cuda import triton_attention as kernels
from pytgi.errors import ModelLoadError

PREFILL_BLOCK_M = 64  # queries per prefill program
PREFILL_BLOCK_N = 64  # keys per inner step of the prefill kernel
DECODE_BLOCK_N = 64  # keys per inner step of the decode kernel
MIN_DOT = 16  # tl.dot's smallest tile side on GPU: smaller groups and heads are padded
MAX_SPLITS = 32  # key splits of one decode row (and KV head)
KV_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class TritonAttentionMetadata:
    """One step's attention metadata (device tensors), shared by every layer."""

    slot_mapping: torch.Tensor  # [T] int64; < 0: store nothing (graph padding)
    num_decode_rows: int
    decode_tables: torch.Tensor  # [B, W] int64
    decode_seq_lens: torch.Tensor  # [B] int64
    num_splits: int
    prefill_tiles: torch.Tensor | None  # [N, 4] int64: flat start, queries, first position, row
    block_table: torch.Tensor  # [R, W] int64, every row (prefill tiles index it)
    block_size: int
    batch: AttentionBatch | None = None  # the step's host-side layout (latent attention reads it)

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def decode_splits(num_rows: int, num_kv_heads: int, num_sms: int) -> int:
    """Key splits per (row, KV head) so that a decode step fills about two waves of the GPU's
    streaming multiprocessors; from the batch shape only, never the lengths."""
    programs = max(1, num_rows * num_kv_heads)
    return max(1, min(MAX_SPLITS, triton.cdiv(2 * num_sms, programs)))


def prefill_tiles(batch: AttentionBatch, block_m: int = PREFILL_BLOCK_M) -> torch.Tensor | None:
    """[N, 4] int64 host tensor, one row per tile of up to `block_m` queries of a non-decode row:
    (first flat token, number of queries, position of the first query, row index)."""
    first_row = batch.num_decode_rows
    if first_row == batch.num_rows:
        return None
    starts = batch.query_start_loc[first_row:-1].cpu()  # [P]
    num_queries = batch.query_start_loc[first_row + 1 :].cpu() - starts  # [P]
    positions = batch.seq_lens[first_row:].cpu() - num_queries  # [P]
    num_tiles = (num_queries + block_m - 1) // block_m  # [P]
    row = torch.repeat_interleave(torch.arange(first_row, batch.num_rows), num_tiles)  # [N]
    tile_first = torch.cumsum(num_tiles, 0) - num_tiles  # [P]
    offset = (torch.arange(row.shape[0]) - tile_first.repeat_interleave(num_tiles)) * block_m
    local = row - first_row
    count = torch.clamp(num_queries[local] - offset, max=block_m)
    return torch.stack([starts[local] + offset, count, positions[local] + offset, row], dim=1)


class TritonMetadataBuilder(AttentionMetadataBuilder):
    def __init__(self, specs: Iterable[KVCacheSpec], num_sms: int):
        self.max_kv_heads = max((s.num_kv_heads for s in specs), default=1)
        self.num_sms = num_sms

    def build(self, batch: AttentionBatch) -> TritonAttentionMetadata:
        device = batch.slot_mapping.device
        table = batch.block_table.to(device, non_blocking=True)  # as is when already there
        seq_lens = batch.seq_lens.to(device, non_blocking=True)
        num_decode = batch.num_decode_rows
        tiles = prefill_tiles(batch)
        return TritonAttentionMetadata(
            slot_mapping=batch.slot_mapping,
            num_decode_rows=num_decode,
            decode_tables=table[:num_decode],
            decode_seq_lens=seq_lens[:num_decode],
            num_splits=decode_splits(num_decode, self.max_kv_heads, self.num_sms),
            prefill_tiles=None if tiles is None else tiles.to(device, non_blocking=True),
            block_table=table,
            block_size=batch.block_size,
            batch=batch,
        )


class TritonAttentionImpl(AttentionImpl):
    def __init__(self, params: AttentionParams):
        super().__init__(params)
        self.group = params.num_heads // params.num_kv_heads
        self.window = params.sliding_window or 0
        self.softcap = params.logits_soft_cap or 0.0
        self.slopes = (
            None
            if params.alibi_slopes is None
            else torch.tensor(params.alibi_slopes, dtype=torch.float32)
        )  # [H], moved to the device on first use
        self.block_d = max(MIN_DOT, triton.next_power_of_2(params.head_size))
        self.block_dv = max(MIN_DOT, triton.next_power_of_2(params.v_size))

    def forward(self, q, k, v, kv_cache: KVCache, metadata: TritonAttentionMetadata):
        """q [T, H, D], k [T, KVH, D], v [T, KVH, Dv] -> [T, H, Dv] (rows in the batch's order:
        decode rows first); k and v are stored in the cache first."""
        k_cache, v_cache = kv_cache  # [num_blocks, block_size, KVH, D] / [..., Dv]
        self._store(k, v, k_cache, v_cache, metadata.slot_mapping)
        p = self.params
        out = torch.empty(q.shape[0], p.num_heads, p.v_size, dtype=q.dtype, device=q.device)
        slopes = self._slopes(q.device)
        if metadata.num_decode_rows:
            self._decode(q, k_cache, v_cache, out, slopes, metadata)
        if metadata.prefill_tiles is not None:
            self._prefill(q, k_cache, v_cache, out, slopes, metadata)
        return out

    def _slopes(self, device: torch.device) -> torch.Tensor | None:
        if self.slopes is not None and self.slopes.device != device:
            self.slopes = self.slopes.to(device)
        return self.slopes

    def _store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        num_tokens = k.shape[0]
        if num_tokens == 0:
            return
        p = self.params
        kernels.store_kv_kernel[(num_tokens,)](
            k, v, k_cache, v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            NUM_KV_HEADS=p.num_kv_heads, HEAD_SIZE=p.head_size, HEAD_SIZE_V=p.v_size,
            BLOCK_H=triton.next_power_of_2(p.num_kv_heads),
            BLOCK_D=triton.next_power_of_2(p.head_size),
            BLOCK_DV=triton.next_power_of_2(p.v_size),
        )  # fmt: skip

    def _constants(self, q: torch.Tensor) -> dict:
        p = self.params
        return dict(
            WINDOW=self.window, GROUP=self.group, HEAD_SIZE=p.head_size, HEAD_SIZE_V=p.v_size,
            BLOCK_D=self.block_d, BLOCK_DV=self.block_dv, USE_SOFTCAP=self.softcap > 0,
            USE_ALIBI=self.slopes is not None, IEEE=q.dtype == torch.float32,
            UPCAST=kernels.INTERPRETED,
        )  # fmt: skip

    def _decode(self, q, k_cache, v_cache, out, slopes, md: TritonAttentionMetadata) -> None:
        p = self.params
        rows, splits = md.num_decode_rows, md.num_splits
        part_acc = torch.empty(rows, p.num_heads, splits, p.v_size, dtype=torch.float32,
                               device=q.device)  # fmt: skip
        part_stats = torch.empty(rows, p.num_heads, splits, 2, dtype=torch.float32,
                                 device=q.device)  # fmt: skip
        kernels.decode_split_kernel[(rows, p.num_kv_heads, splits)](
            q, k_cache, v_cache, md.decode_tables, md.decode_seq_lens, slopes,
            part_acc, part_stats, q.stride(0), q.stride(1), md.decode_tables.stride(0), splits,
            p.scale, self.softcap,
            BLOCK_SIZE=md.block_size, NUM_HEADS=p.num_heads, NUM_KV_HEADS=p.num_kv_heads,
            BLOCK_G=max(MIN_DOT, triton.next_power_of_2(self.group)), BLOCK_N=DECODE_BLOCK_N,
            **self._constants(q),
        )  # fmt: skip
        kernels.decode_merge_kernel[(rows, p.num_heads)](
            part_acc, part_stats, out, out.stride(0), out.stride(1), splits,
            NUM_HEADS=p.num_heads, HEAD_SIZE_V=p.v_size,
            BLOCK_S=triton.next_power_of_2(MAX_SPLITS), BLOCK_DV=triton.next_power_of_2(p.v_size),
        )  # fmt: skip

    def _prefill(self, q, k_cache, v_cache, out, slopes, md: TritonAttentionMetadata) -> None:
        p = self.params
        tiles = md.prefill_tiles
        kernels.prefill_kernel[(tiles.shape[0], p.num_heads)](
            q, k_cache, v_cache, out, tiles, md.block_table, slopes,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), md.block_table.stride(0),
            p.scale, self.softcap,
            BLOCK_SIZE=md.block_size, NUM_KV_HEADS=p.num_kv_heads,
            BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, **self._constants(q),
        )  # fmt: skip


class TritonAttentionBackend(AttentionBackend):
    name = "triton-paged"

    def __init__(self, num_sms: int = 1):
        self.num_sms = num_sms  # the GPU's streaming multiprocessors (decode split count)

    def make_impl(self, params: AttentionParams) -> TritonAttentionImpl:
        if params.num_heads % params.num_kv_heads:
            raise ModelLoadError(
                f"{params.num_heads} attention heads are not a multiple of "
                f"{params.num_kv_heads} KV heads"
            )
        if params.kv_cache_dtype is not None and params.kv_cache_dtype not in KV_DTYPES:
            raise ModelLoadError(
                f"the {self.name} attention backend does not support a {params.kv_cache_dtype} "
                "KV cache"
            )
        if params.alibi_slopes is not None and len(params.alibi_slopes) != params.num_heads:
            raise ModelLoadError(
                f"{len(params.alibi_slopes)} ALiBi slopes for {params.num_heads} heads"
            )
        if params.attention_chunk_size is not None:
            raise ModelLoadError(
                f"the {self.name} attention backend does not support chunked attention "
                "(Llama 4's attention_chunk_size) yet"
            )
        return TritonAttentionImpl(params)

    def allocate_kv_cache(self, spec: KVCacheSpec, num_blocks, block_size, device) -> KVCache:
        if isinstance(spec, LatentAttentionSpec):  # one vector per token (layers/latent_attention)
            size = (num_blocks * block_size, spec.head_size)
            return (torch.zeros(size, dtype=spec.dtype, device=device),)
        shape = (num_blocks, block_size, spec.num_kv_heads)
        return (
            torch.zeros(*shape, spec.head_size, dtype=spec.dtype, device=device),
            torch.zeros(*shape, spec.head_size_v, dtype=spec.dtype, device=device),
        )

    def metadata_builder(self, specs, num_blocks: int, block_size: int) -> TritonMetadataBuilder:
        return TritonMetadataBuilder(specs, self.num_sms)
