"""The compiled CPU kernels (pytgi/backends/cpu/csrc/ops.cpp) against torch references: paged
decode attention read in place (GQA, sliding windows, scattered blocks, strided queries), the
flash-style prefill attention of a fresh prompt, the KV store, and their refusal of out-of-range
metadata or shapes (an error, never a crash)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pytgi.backends.cpu import kernels


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


def paged(keys: list[torch.Tensor], num_blocks: int, block_size: int, seed: int):
    """Scatter each sequence's [L, KVH, D] keys into a head-major cache over shuffled blocks."""
    kvh, d = keys[0].shape[1:]
    cache = torch.randn(kvh, num_blocks * block_size, d)  # garbage where nothing was written
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables = []
    for seq in keys:
        n = -(-seq.shape[0] // block_size)
        table, order = order[:n], order[n:]
        for p in range(seq.shape[0]):
            cache[:, table[p // block_size] * block_size + p % block_size] = seq[p]
        tables.append(table)
    width = max(len(t) for t in tables)
    return cache, torch.tensor([t + [0] * (width - len(t)) for t in tables])


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (9, 3)])
@pytest.mark.parametrize("window", [None, 5])
def test_decode_attention_matches_sdpa(ops, heads, kv_heads, window):
    g = torch.Generator().manual_seed(heads + kv_heads)
    d, bs, lengths = 16, 4, [1, 7, 13, 30]
    keys = [torch.randn(n, kv_heads, d, generator=g) for n in lengths]
    values = [torch.randn(n, kv_heads, d, generator=g) for n in lengths]
    k_cache, tables = paged(keys, 24, bs, seed=1)
    v_cache, _ = paged(values, 24, bs, seed=1)
    qkv = torch.randn(len(lengths), heads + 2 * kv_heads, d, generator=g)
    q = qkv[:, :heads]  # strided rows, as the model passes it
    seq_lens = torch.tensor(lengths)
    first = (seq_lens - window).clamp(min=0) if window else torch.zeros_like(seq_lens)
    out = ops.decode_attention(q, k_cache, v_cache, tables, first, seq_lens, bs, d**-0.5)
    for b, n in enumerate(lengths):
        lo = int(first[b])
        expected = F.scaled_dot_product_attention(
            q[b].unsqueeze(1),  # [H, 1, D]
            keys[b][lo:n].transpose(0, 1),  # [KVH, L, D]
            values[b][lo:n].transpose(0, 1),
            scale=d**-0.5,
            enable_gqa=True,
        ).squeeze(1)
        torch.testing.assert_close(out[b], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "tokens,heads,kv_heads,d,window",
    [
        (1, 4, 2, 16, 0),
        (47, 4, 2, 16, 0),  # one query block, partial
        (48, 9, 3, 64, 0),  # exactly one query block
        (130, 9, 3, 64, 0),  # three query blocks, three key blocks, ragged ends
        (130, 4, 2, 32, 24),  # a window smaller than a key block
        (200, 4, 4, 16, 70),  # a window spanning blocks, no GQA
        (300, 2, 1, 16, 300),  # a window as long as the prompt
    ],
)
def test_prefill_attention_matches_sdpa(ops, tokens, heads, kv_heads, d, window):
    g = torch.Generator().manual_seed(tokens + heads)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, d, generator=g)  # strided views, as the model
    q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
    pos = torch.arange(tokens)
    mask = pos[None, :] <= pos[:, None]  # [q, k]
    if window:
        mask &= pos[:, None] - pos[None, :] < window
    expected = F.scaled_dot_product_attention(
        *(x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)),
        attn_mask=mask,
        scale=d**-0.5,
        enable_gqa=True,
    )[0].transpose(0, 1)  # [T, H, D]
    out = ops.prefill_attention(q, k, v, d**-0.5, window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "start,num_queries,window",
    [(16, 20, 0), (40, 1, 0), (70, 60, 0), (100, 30, 24), (5, 130, 50), (64, 64, 0)],
)
def test_prefill_attention_paged_matches_sdpa(ops, start, num_queries, window):
    """A later chunk or a prefix hit: queries at positions start.., all keys in scattered blocks."""
    g = torch.Generator().manual_seed(start + num_queries)
    heads, kv_heads, d, bs, end = 6, 2, 32, 16, start + num_queries
    keys, values = (torch.randn(end, kv_heads, d, generator=g) for _ in range(2))
    k_cache, tables = paged([keys], 24, bs, seed=2)
    v_cache, _ = paged([values], 24, bs, seed=2)
    q = torch.randn(num_queries, heads + 2 * kv_heads, d, generator=g)[:, :heads]
    query_pos, key_pos = torch.arange(start, end)[:, None], torch.arange(end)[None, :]
    mask = key_pos <= query_pos  # [q, end]
    if window:
        mask &= query_pos - key_pos < window
    expected = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.transpose(0, 1).unsqueeze(0),
        values.transpose(0, 1).unsqueeze(0),
        attn_mask=mask,
        scale=d**-0.5,
        enable_gqa=True,
    )[0].transpose(0, 1)
    out = ops.prefill_attention_paged(q, k_cache, v_cache, tables[0], start, bs, d**-0.5, window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_prefill_attention_paged_refuses_bad_tables(ops):
    q, cache = torch.randn(4, 2, 16), torch.randn(1, 64, 16)
    with pytest.raises(RuntimeError, match="block id out of range"):
        ops.prefill_attention_paged(q, cache, cache, torch.tensor([0, 9]), 10, 8, 1.0, 0)
    with pytest.raises(RuntimeError, match="does not cover"):
        ops.prefill_attention_paged(q, cache, cache, torch.tensor([0]), 10, 8, 1.0, 0)


def test_prefill_attention_refuses_bad_shapes(ops):
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        ops.prefill_attention(
            torch.randn(5, 4, 8), torch.randn(5, 2, 8), torch.randn(5, 2, 8), 1.0, 0
        )
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        ops.prefill_attention(torch.randn(5, 3, 16), k, k, 1.0, 0)
    with pytest.raises(RuntimeError, match=r"q \[T, H, D\]"):
        ops.prefill_attention(q, torch.randn(6, 2, 16), torch.randn(6, 2, 16), 1.0, 0)
    with pytest.raises(RuntimeError, match="window"):
        ops.prefill_attention(q, k, k, 1.0, -1)


def test_store_kv_matches_index_copy(ops):
    k, v = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    slots = torch.tensor([7, 0, 12, 3, 8])
    caches = [torch.zeros(3, 16, 8) for _ in range(4)]
    ops.store_kv(k, v, caches[0], caches[1], slots)
    caches[2].index_copy_(1, slots, k.transpose(0, 1))
    caches[3].index_copy_(1, slots, v.transpose(0, 1))
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_out_of_range_metadata_is_an_error(ops):
    cache = torch.zeros(2, 8, 4)
    with pytest.raises(RuntimeError, match="bad slot"):
        ops.store_kv(
            torch.ones(1, 2, 4), torch.ones(1, 2, 4), cache, cache.clone(), torch.tensor([8])
        )
    q = torch.randn(1, 2, 4)
    with pytest.raises(RuntimeError, match="block id out of range"):
        ops.decode_attention(
            q, cache, cache, torch.tensor([[5]]), torch.tensor([0]), torch.tensor([3]), 4, 0.5
        )
    with pytest.raises(RuntimeError, match="bad key range"):
        ops.decode_attention(
            q, cache, cache, torch.tensor([[0]]), torch.tensor([0]), torch.tensor([9]), 4, 0.5
        )


def test_disabled_by_environment(monkeypatch):
    from pytgi import envs
    from pytgi.backends.selector import select_platform

    monkeypatch.setenv("PYTGI_CPU_KERNELS", "0")
    platform = select_platform(envs.device_config())
    assert platform.kernels is None and platform.kernels_for(torch.float32) is None


def test_kernels_serve_fp32_models_only():
    from pytgi.backends.selector import select_platform

    platform = select_platform()
    assert platform.kernels_for(torch.float32) is kernels.load_cpu_kernels()
    assert platform.kernels_for(torch.bfloat16) is None


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 16, 33])
@pytest.mark.parametrize("blocks,width", [(1, 16), (3, 16), (2, 20)])  # 20: the scalar tail
def test_linear_packed_matches_matmul(ops, rows, blocks, width):
    g = torch.Generator().manual_seed(rows * 100 + width)
    k = 37
    weight = torch.randn(blocks * width, k, generator=g)  # [N, K]
    packed = weight.view(blocks, width, k).transpose(1, 2).contiguous()  # [C, K, n]
    x = torch.randn(rows, 2 * k, generator=g)[:, :k]  # rows 2K apart, as a view of a wider row
    bias = torch.randn(blocks * width, generator=g)
    torch.testing.assert_close(ops.linear_packed(x, packed), x @ weight.T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        ops.linear_packed(x, packed, bias), x @ weight.T + bias, rtol=1e-5, atol=1e-5
    )
    with pytest.raises(RuntimeError, match="disagree on K"):
        ops.linear_packed(x[:, :-1].contiguous(), packed)
