"""The Triton paged attention (backends/cuda/attention.py) against a plain-torch reference, for
every AttentionParams feature, on mixed steps: decode rows (short and long contexts, several key
splits), a chunked prefill, a prefix-cache hit and fresh prompts longer than a query tile. On CPU
through Triton's interpreter (small shapes: it runs every program in Python)."""

from __future__ import annotations

import math

import pytest
import torch
from backends.cuda.reference import reference_attention

from pytgi.backends.base import AttentionBatch, AttentionParams, kv_cache_spec
from pytgi.backends.cuda.attention import (
    PREFILL_BLOCK_M,
    TritonAttentionBackend,
    decode_splits,
    prefill_tiles,
)
from pytgi.errors import ModelLoadError

BLOCK_SIZE = 4
NUM_BLOCKS = 96

# (tokens cached before the step, tokens of this step) per row: decode rows first
MIXED_ROWS = [(8, 1), (2, 1), (70, 1), (5, 7), (16, 3), (0, 70), (0, 2)]


def alibi_slopes(num_heads: int) -> tuple[float, ...]:
    return tuple(2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads))


CASES = {
    "gqa": dict(num_heads=4, num_kv_heads=2, head_size=16),
    "mha-window": dict(num_heads=2, num_kv_heads=2, head_size=16, sliding_window=6),
    "mqa-softcap-alibi": dict(
        num_heads=4, num_kv_heads=1, head_size=16, logits_soft_cap=2.0, alibi_slopes=alibi_slopes(4)
    ),
    "head-size-v-odd-dims": dict(num_heads=2, num_kv_heads=1, head_size=12, head_size_v=20),
}


def make_batch(rows, device, seed: int = 0) -> AttentionBatch:
    """A step over `rows`, each with a shuffled block table; slots of this step's tokens."""
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(NUM_BLOCKS, generator=generator).tolist()
    tables, slots, starts, seq_lens = [], [], [0], []
    for cached, num_new in rows:
        length = cached + num_new
        count = -(-length // BLOCK_SIZE)
        table, order = order[:count], order[count:]
        tables.append(table)
        slots += [
            table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(cached, length)
        ]
        starts.append(starts[-1] + num_new)
        seq_lens.append(length)
    width = max(len(t) for t in tables)
    block_table = torch.zeros(len(rows), width, dtype=torch.int64)
    for i, table in enumerate(tables):
        block_table[i, : len(table)] = torch.tensor(table)
    return AttentionBatch(
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor(seq_lens),
        block_table=block_table,
        slot_mapping=torch.tensor(slots, device=device),
        block_size=BLOCK_SIZE,
        num_decode_rows=sum(1 for _, n in rows if n == 1),
    )


def run_case(params: AttentionParams, rows, device, dtype, num_sms: int = 4):
    torch.manual_seed(0)
    backend = TritonAttentionBackend(num_sms=num_sms)
    impl = backend.make_impl(params)
    spec = kv_cache_spec(params, dtype)
    cache = backend.allocate_kv_cache(spec, NUM_BLOCKS, BLOCK_SIZE, device)
    for c in cache:
        c.copy_(torch.randn(c.shape))  # earlier tokens' K/V (this step's are stored by forward)
    batch = make_batch(rows, device)
    num_tokens = int(batch.query_start_loc[-1])
    q = torch.randn(num_tokens, params.num_heads, params.head_size).to(device, dtype)
    qkv = torch.randn(num_tokens, params.num_kv_heads, params.head_size + params.v_size)
    k = qkv[..., : params.head_size].to(device, dtype)  # strided views, as the model's
    v = qkv[..., params.head_size :].to(device, dtype)
    metadata = backend.metadata_builder([spec], NUM_BLOCKS, BLOCK_SIZE).build(batch)
    out = impl.forward(q, k, v, cache, metadata)
    slots = batch.slot_mapping.cpu()
    for stored, new in zip(cache, (k, v), strict=True):  # this step's K/V went to their slots
        flat = stored.view(-1, *stored.shape[2:]).cpu()
        assert torch.equal(flat[slots], new.cpu())
    return out, reference_attention(q, cache, batch, params), metadata


@pytest.mark.parametrize("case", list(CASES))
def test_mixed_step_matches_reference(device, case):
    params = AttentionParams(scale=1 / math.sqrt(CASES[case]["head_size"]), **CASES[case])
    out, expected, metadata = run_case(params, MIXED_ROWS, device, torch.float32)
    assert metadata.num_splits > 1  # the long decode row is split over several programs
    assert out.shape == (expected.shape[0], params.num_heads, params.v_size)
    torch.testing.assert_close(out.cpu(), expected, atol=2e-5, rtol=2e-5)


def test_bf16_decode_and_prefill(device):
    params = AttentionParams(num_heads=4, num_kv_heads=2, head_size=16, scale=0.25)
    out, expected, _ = run_case(params, MIXED_ROWS[:3] + MIXED_ROWS[5:6], device, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), expected, atol=3e-2, rtol=3e-2)


def test_padding_slots_store_nothing(device):
    """Slot -1 (a replayed graph's padding rows) leaves the cache untouched."""
    params = AttentionParams(num_heads=2, num_kv_heads=1, head_size=16, scale=0.25)
    backend = TritonAttentionBackend()
    impl = backend.make_impl(params)
    cache = backend.allocate_kv_cache(kv_cache_spec(params, torch.float32), 4, BLOCK_SIZE, device)
    batch = make_batch([(3, 1), (2, 1)], device)
    batch.slot_mapping = torch.tensor([5, -1], device=device)
    metadata = backend.metadata_builder([], 4, BLOCK_SIZE).build(batch)
    k = torch.ones(2, 1, 16, device=device)
    impl.forward(torch.ones(2, 2, 16, device=device), k, k, cache, metadata)
    stored = cache[0].view(-1, 16).cpu()
    assert torch.equal(stored[5], torch.ones(16))
    assert int((stored != 0).any(dim=1).sum()) == 1


def test_prefill_tiles_split_rows_into_query_tiles():
    batch = make_batch([(3, 1), (5, PREFILL_BLOCK_M + 2), (0, 2)], "cpu")
    tiles = prefill_tiles(batch).tolist()
    first = 1  # flat start of the second row
    assert tiles == [
        [first, PREFILL_BLOCK_M, 5, 1],
        [first + PREFILL_BLOCK_M, 2, 5 + PREFILL_BLOCK_M, 1],
        [first + PREFILL_BLOCK_M + 2, 2, 0, 2],
    ]
    assert prefill_tiles(make_batch([(3, 1)], "cpu")) is None


def test_decode_splits_depend_on_the_batch_shape_only():
    assert decode_splits(1, 8, num_sms=132) == 32  # capped
    assert decode_splits(32, 8, num_sms=132) == 2
    assert decode_splits(64, 8, num_sms=132) == 1


def test_refuses_what_it_cannot_compute():
    backend = TritonAttentionBackend()
    with pytest.raises(ModelLoadError, match="not a multiple"):
        backend.make_impl(AttentionParams(num_heads=3, num_kv_heads=2, head_size=16, scale=1.0))
    fp8 = AttentionParams(
        num_heads=2, num_kv_heads=1, head_size=16, scale=1.0, kv_cache_dtype=torch.float8_e4m3fn
    )
    with pytest.raises(ModelLoadError, match="KV cache"):
        backend.make_impl(fp8)
