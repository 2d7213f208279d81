"""Two real ranks over gloo: sharded layers (with their all-reduce / gather) equal the unsharded
computation. Rank 0 runs in the test process, rank 1 in one spawned process."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from fixtures.two_ranks import run_on_two_ranks

pytestmark = pytest.mark.tp


def _load(layer, name, tensor, shard_id=None):
    param = getattr(layer, name)
    args = (param, tensor) if shard_id is None else (param, tensor, shard_id)
    param.weight_loader(*args)


def _check_mlp(x):
    from pytgi.layers.linear import MergedColumnParallelLinear, RowParallelLinear

    gate, up, down, bias = (
        torch.randn(12, 8),
        torch.randn(12, 8),
        torch.randn(8, 12),
        torch.randn(8),
    )
    gate_up, down_proj = MergedColumnParallelLinear(8, [12, 12]), RowParallelLinear(12, 8, True)
    _load(gate_up, "weight", gate, 0)
    _load(gate_up, "weight", up, 1)
    _load(down_proj, "weight", down)
    _load(down_proj, "bias", bias)
    g, u = gate_up(x).chunk(2, dim=-1)
    expected = F.linear(F.silu(x @ gate.T) * (x @ up.T), down, bias)
    torch.testing.assert_close(down_proj(F.silu(g) * u), expected)


def _check_qkv(x):
    from pytgi.distributed.comm import tp_all_gather
    from pytgi.layers.linear import QKVParallelLinear

    wq, wk, wv = torch.randn(8, 8), torch.randn(2, 8), torch.randn(2, 8)  # 4 heads, 1 kv head
    qkv = QKVParallelLinear(8, 2, num_heads=4, num_kv_heads=1)
    for shard_id, w in zip("qkv", (wq, wk, wv), strict=True):
        _load(qkv, "weight", w, shard_id)
    q, k, v = qkv(x).split([qkv.q_size, qkv.kv_size, qkv.kv_size], dim=-1)
    torch.testing.assert_close(tp_all_gather(q), x @ wq.T)
    torch.testing.assert_close(k, x @ wk.T)  # the single kv head is replicated on both ranks
    torch.testing.assert_close(v, x @ wv.T)


def _check_vocab(rank):
    from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding

    weight, ids, hidden = torch.randn(11, 8), torch.tensor([0, 5, 6, 10]), torch.randn(3, 8)
    emb, head = VocabParallelEmbedding(11, 8), ParallelLMHead(11, 8)
    _load(emb, "weight", weight)
    _load(head, "weight", weight)
    torch.testing.assert_close(emb(ids), weight[ids])
    logits = head.compute_logits(hidden)
    if rank == 0:
        torch.testing.assert_close(logits, hidden @ weight.T)
    else:
        assert logits is None


def _check_step_transport(rank: int) -> None:
    """Rank 0's step inputs reach rank 1 unchanged over the control group; None means stop."""
    from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
    from pytgi.messages.sampling_params import SamplingParams
    from pytgi.worker.input_builder import InputBuilder
    from pytgi.worker.request_states import RequestStates
    from pytgi.worker.step_transport import receive_step, send_step

    out = SchedulerOutput(
        requests=[
            ScheduledRequest("a", 0, 5, new_block_ids=[3, 1], sample=True, prefill_logprobs=True),
            ScheduledRequest("b", 2, 1, new_block_ids=[7], draft_ids=[9], sample=True),
        ],
        new_requests=[
            NewRequestData("a", [1, 2, 3, 4, 5], SamplingParams()),
            NewRequestData("b", [6, 7, 8], SamplingParams()),
        ],
    )
    states = RequestStates()
    states.update(out)
    expected, _ = InputBuilder(block_size=4).build(out, states)
    if rank == 0:
        send_step(expected)
        send_step(None)
        return
    got = receive_step(torch.device("cpu"))
    for name in ("input_ids", "positions", "logits_indices"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
        assert torch.equal(getattr(got.attn, name), getattr(expected.attn, name)), name
    assert got.attn.num_decode_rows == expected.attn.num_decode_rows
    assert got.logprob_spans == expected.logprob_spans == [(0, 4)]
    assert receive_step(torch.device("cpu")) is None


def _check_quantized_mlp(x):
    """Pre-quantized Q4_0 gate/up (column shards exact) and Q8_0 down (row shards on block
    boundaries) on the compiled kernels, fp32 activations: equal to the unsharded product."""
    from pytgi.backends.cpu.kernels import load_cpu_kernels
    from pytgi.layers.build_context import build_context, current_build_context
    from pytgi.layers.linear import MergedColumnParallelLinear, RowParallelLinear
    from pytgi.layers.quantization.cpu_methods import Int4LinearMethod, Int8LinearMethod
    from pytgi.layers.quantization.packed import FP32_ACTIVATIONS
    from pytgi.layers.quantization.quantizers import quantize_q4_0, quantize_q8_0
    from pytgi.layers.quantization.registry import OnTheFlyQuantConfig

    gate, up = quantize_q4_0(torch.randn(64, 64)), quantize_q4_0(torch.randn(64, 64))
    down = quantize_q8_0(torch.randn(64, 64))
    q4 = OnTheFlyQuantConfig("q4", lambda kernels: Int4LinearMethod(kernels, FP32_ACTIVATIONS))
    q8 = OnTheFlyQuantConfig("q8", lambda kernels: Int8LinearMethod(kernels, FP32_ACTIVATIONS))
    with build_context(replace(current_build_context(), kernels=load_cpu_kernels())):
        gate_up = MergedColumnParallelLinear(64, [64, 64], quant_config=q4)
        down_proj = RowParallelLinear(64, 64, quant_config=q8)
    assert gate_up.quant_method.ops.compiled
    _load(gate_up, "weight", gate, 0)
    _load(gate_up, "weight", up, 1)
    _load(down_proj, "weight", down)
    for layer in (gate_up, down_proj):
        layer.quant_method.process_weights_after_loading(layer)
    g, u = gate_up(x).chunk(2, dim=-1)  # this rank's 32 features of each
    h = F.silu(g) * u
    hidden = F.silu(x @ gate.dequantize().T) * (x @ up.dequantize().T)  # [5, 64]
    rank = torch.distributed.get_rank()
    torch.testing.assert_close(h, hidden[:, 32 * rank : 32 * rank + 32], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(down_proj(h), hidden @ down.dequantize().T, rtol=1e-4, atol=1e-4)


def _check_rank(rank: int, tp) -> None:
    from pytgi.distributed.comm import tp_min
    from pytgi.layers.build_context import BuildContext, build_context

    x = torch.randn(5, 8)
    with build_context(BuildContext(tp=tp)):  # layers built here are this rank's shard
        _check_mlp(x)
        _check_qkv(x)
        _check_vocab(rank)
        _check_quantized_mlp(torch.randn(5, 64))
    assert tp_min(10 + rank) == 10
    _check_step_transport(rank)


def test_sharded_layers_equal_unsharded():
    run_on_two_ranks(_check_rank)
