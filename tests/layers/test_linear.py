"""Parallel linear and embedding layers on simulated ranks (no process group): each rank's shard,
built and loaded from the full checkpoint tensors, combines (concat / sum) to the unsharded result.
Also the weight loaders' shape checks. The real two-process gloo run is in test_tp.py."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from pytgi.distributed import parallel_state
from pytgi.distributed.parallel_state import TPInfo
from pytgi.errors import ModelLoadError
from pytgi.layers import embedding
from pytgi.layers.build_context import build_context, current_build_context
from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pytgi.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)


@pytest.fixture
def as_rank(monkeypatch):
    """Layers built after `set_rank(rank, world_size)` are that rank's shard. The process itself
    is one rank, so the collectives are identities and the test combines the shards."""
    monkeypatch.setattr(parallel_state, "_TP_INFO", TPInfo(0, 1))
    with ExitStack() as stack:

        def set_rank(rank: int, world_size: int) -> None:
            context = replace(current_build_context(), tp=TPInfo(rank, world_size))
            stack.enter_context(build_context(context))

        yield set_rank


def load(layer, name: str, tensor: torch.Tensor, shard_id=None) -> None:
    param = getattr(layer, name)
    if shard_id is None:
        param.weight_loader(param, tensor)
    else:
        param.weight_loader(param, tensor, shard_id)


def test_column_and_row_parallel_mlp_combine(as_rank):
    torch.manual_seed(0)
    w_up, b_up, w_down, b_down = (
        torch.randn(12, 8),
        torch.randn(12),
        torch.randn(8, 12),
        torch.randn(8),
    )
    x = torch.randn(3, 8)
    full = F.linear(F.linear(x, w_up, b_up), w_down, b_down)
    partial_sum = 0
    for rank in range(2):
        as_rank(rank, 2)
        up, down = ColumnParallelLinear(8, 12, bias=True), RowParallelLinear(12, 8, bias=True)
        load(up, "weight", w_up), load(up, "bias", b_up)
        load(down, "weight", w_down), load(down, "bias", b_down)
        assert up.weight.shape == (6, 8) and down.weight.shape == (8, 6)
        partial_sum = partial_sum + down(up(x)) - b_down  # bias is added after the reduction
    torch.testing.assert_close(partial_sum + b_down, full)


@pytest.mark.parametrize("world_size,num_kv_heads", [(1, 2), (2, 2), (4, 2), (2, 1)])
def test_qkv_shards_heads(as_rank, world_size, num_kv_heads):
    torch.manual_seed(0)
    num_heads, head_dim, hidden = 4, 3, 10
    wq = torch.randn(num_heads * head_dim, hidden)
    wk, wv = (torch.randn(num_kv_heads * head_dim, hidden) for _ in range(2))
    x = torch.randn(2, hidden)
    qs, ks = [], []
    for rank in range(world_size):
        as_rank(rank, world_size)
        layer = QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads)
        for shard_id, w in zip("qkv", (wq, wk, wv), strict=True):
            load(layer, "weight", w, shard_id)
        q, k, v = layer(x).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        qs.append(q)
        ks.append(k)
        kv_head = rank * num_kv_heads // world_size  # replicated when fewer kv heads than ranks
        expected_k = F.linear(x, wk)[:, kv_head * head_dim :][:, : layer.kv_size]
        torch.testing.assert_close(k, expected_k)
        torch.testing.assert_close(v, F.linear(x, wv)[:, kv_head * head_dim :][:, : layer.kv_size])
    torch.testing.assert_close(torch.cat(qs, dim=-1), F.linear(x, wq))


def test_merged_column_parallel(as_rank):
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    x = torch.randn(2, 4)
    outs = []
    for rank in range(2):
        as_rank(rank, 2)
        layer = MergedColumnParallelLinear(4, [6, 6])
        load(layer, "weight", gate, 0)
        load(layer, "weight", up, 1)
        outs.append(layer(x).chunk(2, dim=-1))  # this rank's (gate, up)
    torch.testing.assert_close(torch.cat([o[0] for o in outs], -1), F.linear(x, gate))
    torch.testing.assert_close(torch.cat([o[1] for o in outs], -1), F.linear(x, up))


def test_vocab_parallel_embedding_and_head_with_padding(as_rank):
    weight = torch.randn(11, 4)  # 11 rows over 2 ranks: 6 + 5 (+1 zero pad)
    ids = torch.tensor([0, 5, 6, 10, 3])
    hidden = torch.randn(3, 4)
    embedded, logits = 0, []
    for rank in range(2):
        as_rank(rank, 2)
        emb, head = VocabParallelEmbedding(11, 4), ParallelLMHead(11, 4)
        load(emb, "weight", weight)
        load(head, "weight", weight)
        embedded = embedded + emb(ids)
        logits.append(F.linear(hidden, head.weight))
    torch.testing.assert_close(embedded, weight[ids])
    torch.testing.assert_close(torch.cat(logits, -1)[:, :11], hidden @ weight.T)


def test_single_rank_layers():
    w = torch.randn(5, 3)
    layer = ReplicatedLinear(3, 5)
    load(layer, "weight", w)
    x = torch.randn(2, 3)
    torch.testing.assert_close(layer(x), x @ w.T)
    head = ParallelLMHead(5, 3)
    load(head, "weight", w)
    torch.testing.assert_close(head.compute_logits(x), x @ w.T)


def test_shape_mismatch_is_a_load_error():
    layer = QKVParallelLinear(8, 2, num_heads=4, num_kv_heads=2)
    with pytest.raises(
        ModelLoadError, match=r"checkpoint shape \(8, 9\) does not match .*\(8, 8\)"
    ):
        load(layer, "weight", torch.randn(8, 9), "q")
    with pytest.raises(ModelLoadError, match="does not match"):
        load(VocabParallelEmbedding(10, 4), "weight", torch.randn(11, 4))


def test_indivisible_heads_are_a_load_error(as_rank):
    as_rank(0, 3)
    with pytest.raises(ModelLoadError, match="number of attention heads \\(4\\) is not divisible"):
        QKVParallelLinear(8, 2, num_heads=4, num_kv_heads=2)


@pytest.mark.parametrize("world_size", [1, 2])
def test_packed_head_and_tied_embedding_match_the_matrix(
    as_rank, monkeypatch, world_size, cpu_kernels
):
    """CPU fp32 head packed into vocab blocks (3 rows per block here without the kernels, 16 with
    them; the last block of each rank is zero-padded): logits and the tied embedding's rows are
    unchanged."""
    monkeypatch.setattr(embedding, "VOCAB_BLOCK", 3)
    weight = torch.randn(11, 4)
    ids = torch.tensor([0, 5, 6, 10, 3, 7])
    hidden = torch.randn(2, 4)
    embedded, logits = 0, []
    for rank in range(world_size):
        as_rank(rank, world_size)
        emb, head = VocabParallelEmbedding(11, 4), ParallelLMHead(11, 4)
        head.tie(emb)
        load(emb, "weight", weight)
        head.process_weights_after_loading()
        assert emb.blocks is head.blocks and head.weight.numel() == 0  # held once
        embedded = embedded + emb._rows(_local(ids, emb)) * _is_local(ids, emb)
        logits.append(head._local_logits(hidden))
    torch.testing.assert_close(embedded, weight[ids])
    torch.testing.assert_close(torch.cat(logits, -1)[:, :11], hidden @ weight.T)


def _is_local(ids, emb):
    return ((ids >= emb.vocab_start) & (ids < emb.vocab_end)).unsqueeze(1)


def _local(ids, emb):
    return (ids - emb.vocab_start) * _is_local(ids, emb).squeeze(1)


@pytest.mark.parametrize("bias", [False, True])
def test_unquantized_cpu_fp32_layouts(cpu_kernels, bias):
    """After loading: packed 16-column tiles with the compiled kernels (20 outputs: one padded
    tile), else column-major for wide layers; the result is the plain x @ W.T (+ b) either way."""
    wide, narrow = ReplicatedLinear(8, 20, bias=bias), ReplicatedLinear(20, 8, bias=bias)
    for layer in (wide, narrow):
        w = torch.randn(layer.output_size, layer.input_size)
        load(layer, "weight", w)
        b = torch.randn(layer.output_size)
        if bias:
            load(layer, "bias", b)
        layer.quant_method.process_weights_after_loading(layer)
        for rows in (1, 7, 40):
            x = torch.randn(rows, layer.input_size)
            expected = x @ w.T + (b if bias else 0)
            torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    if cpu_kernels == "compiled":
        assert wide.weight_packed.shape == (2, 8, 16) and wide.weight.numel() == 0
    else:
        assert wide.weight.t().is_contiguous() and not wide.weight.is_contiguous()
        assert narrow.weight.is_contiguous()


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("layout", ["concat", "grouped"])
def test_qkv_from_one_checkpoint_tensor(as_rank, world_size, layout):
    """A checkpoint's fused q/k/v tensor (weight and bias) loads like the three separate ones:
    [q | k | v] (GPT-2, Phi-3, W_pack) or grouped per KV head [2 query heads | k | v] (Falcon)."""
    torch.manual_seed(0)
    heads, kv_heads, d, hidden = 4, 2, 3, 10
    wq, bq = torch.randn(heads * d, hidden), torch.randn(heads * d)
    wk, wv, bk, bv = (torch.randn(kv_heads * d, *s) for s in ((hidden,), (hidden,), (), ()))
    if layout == "concat":
        fused_w, fused_b = torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv])
    else:  # per KV head g: query heads 2g, 2g + 1, then k_g, v_g

        def group(q, k, v, g):
            return [q[2 * g * d : (2 * g + 2) * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]]

        fused_w = torch.cat([t for g in range(kv_heads) for t in group(wq, wk, wv, g)])
        fused_b = torch.cat([t for g in range(kv_heads) for t in group(bq, bk, bv, g)])
    x = torch.randn(2, hidden)
    for rank in range(world_size):
        as_rank(rank, world_size)
        expected = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True)
        for shard_id, w, b in zip("qkv", (wq, wk, wv), (bq, bk, bv), strict=True):
            load(expected, "weight", w, shard_id), load(expected, "bias", b, shard_id)
        fused = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True, checkpoint_layout=layout)
        load(fused, "weight", fused_w), load(fused, "bias", fused_b)
        torch.testing.assert_close(fused(x), expected(x), rtol=0, atol=0)
    with pytest.raises(ModelLoadError, match="fused projection"):
        load(fused, "weight", fused_w[:-1])


def test_merged_column_from_one_checkpoint_tensor(as_rank):
    """Phi-3's gate_up_proj: [gate | up] in one tensor, sharded per rank like the two halves."""
    torch.manual_seed(0)
    gate, up, x = torch.randn(6, 5), torch.randn(6, 5), torch.randn(3, 5)
    for rank in range(2):
        as_rank(rank, 2)
        layer = MergedColumnParallelLinear(5, [6, 6])
        load(layer, "weight", torch.cat([gate, up]))
        expected = torch.cat(
            [F.linear(x, gate)[:, 3 * rank :][:, :3], F.linear(x, up)[:, 3 * rank :][:, :3]], 1
        )
        torch.testing.assert_close(layer(x), expected)


def test_lm_head_bias(as_rank, cpu_kernels):
    """Phi's and GPT-J's biased LM head, sharded with the vocabulary and kept when packed."""
    torch.manual_seed(0)
    weight, bias, x = torch.randn(37, 8), torch.randn(37), torch.randn(2, 8)
    logits = []
    for rank in range(2):
        as_rank(rank, 2)
        head = ParallelLMHead(37, 8, bias=True)
        load(head, "weight", weight), load(head, "bias", bias)
        head.process_weights_after_loading()
        logits.append(head._local_logits(x))
    torch.testing.assert_close(torch.cat(logits, -1)[:, :37], F.linear(x, weight, bias))
