"""Two real ranks over gloo: a sparse MoE block whose experts and shared expert are split over
the intermediate dimension equals the unsharded block (rank 0 in the test process, rank 1
spawned); Llama 4's block (sigmoid router scaling the expert input, stacked [in, out] experts,
always-on shared expert) equals transformers' Llama4TextMoe."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures.two_ranks import run_on_two_ranks
from layers.moe_utils import load_experts, load_shared_expert, per_token_experts

pytestmark = pytest.mark.tp

HIDDEN, EXPERT, SHARED, NUM_EXPERTS = 8, 12, 16, 4


def _reference(x, gate, w1, w3, w2, shared, shared_gate, top_k):
    """Per token: softmax top-k (not renormalised) over full experts, plus the gated shared MLP."""
    weights, ids = (x @ gate.T).softmax(-1).topk(top_k, dim=-1)
    out = per_token_experts(x, weights, ids, w1, w3, w2)
    sg, su, sd = shared
    shared_out = (F.silu(x @ sg.T) * (x @ su.T)) @ sd.T
    return out + torch.sigmoid(x @ shared_gate.T) * shared_out


def _check_block() -> None:
    from pytgi.layers.moe.block import SparseMoeBlock
    from pytgi.layers.moe.config import MoEConfig

    config = MoEConfig(
        num_experts=NUM_EXPERTS,
        top_k=2,
        intermediate_size=EXPERT,
        renormalize=False,
        shared_intermediate_size=SHARED,
        shared_expert_gate=True,
    )
    gate = torch.randn(NUM_EXPERTS, HIDDEN)
    w1, w3 = torch.randn(2, NUM_EXPERTS, EXPERT, HIDDEN).unbind(0)
    w2 = torch.randn(NUM_EXPERTS, HIDDEN, EXPERT)
    shared = (torch.randn(SHARED, HIDDEN), torch.randn(SHARED, HIDDEN), torch.randn(HIDDEN, SHARED))
    shared_gate = torch.randn(1, HIDDEN)
    x = torch.randn(7, HIDDEN)
    block = SparseMoeBlock(config, HIDDEN, None, "mlp")
    with torch.no_grad():
        block.gate.weight.copy_(gate)
        experts = block.experts
        load_experts(experts, w1, w3, w2)
        load_shared_expert(block.shared_experts, *shared)
        block.shared_expert_gate.weight_loader(block.shared_expert_gate.weight, shared_gate)
        assert experts.w13_weight.shape == (NUM_EXPERTS, EXPERT, HIDDEN)  # half of 2 * EXPERT
        expected = _reference(x, gate, w1, w3, w2, shared, shared_gate, 2)
        torch.testing.assert_close(block(x), expected, rtol=1e-4, atol=1e-4)


def _check_llama4_block() -> None:
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    from pytgi.layers.moe.block import SparseMoeBlock
    from pytgi.layers.moe.config import SIGMOID_TOPK, MoEConfig

    hf_config = Llama4TextConfig(
        hidden_size=HIDDEN,
        intermediate_size=EXPERT,
        num_local_experts=NUM_EXPERTS,
        num_experts_per_tok=2,
    )
    reference = Llama4TextMoe(hf_config).eval()
    for param in reference.parameters():
        param.data.normal_()
    config = MoEConfig(
        num_experts=NUM_EXPERTS,
        top_k=2,
        intermediate_size=EXPERT,
        router=SIGMOID_TOPK,
        renormalize=False,
        scale_input=True,
        shared_intermediate_size=EXPERT,
        per_expert_checkpoint=False,
    )
    block = SparseMoeBlock(config, HIDDEN, None, "mlp")
    x = torch.randn(7, HIDDEN)
    with torch.no_grad():
        block.gate.weight.copy_(reference.router.weight)
        experts = block.experts
        experts.weight_loader(experts.w13_weight, reference.experts.gate_up_proj, "w13_in_out")
        experts.weight_loader(experts.w2_weight, reference.experts.down_proj, "w2_in_out")
        ref_shared = reference.shared_expert
        linears = (ref_shared.gate_proj, ref_shared.up_proj, ref_shared.down_proj)
        load_shared_expert(block.shared_experts, *(linear.weight for linear in linears))
        torch.testing.assert_close(block(x), reference(x)[0], rtol=1e-4, atol=1e-4)


def _check_rank(rank: int, tp) -> None:
    from pytgi.layers.build_context import BuildContext, build_context

    with build_context(BuildContext(tp=tp)):  # layers built here are this rank's shard
        _check_block()
        _check_llama4_block()


def test_llama4_block_equals_transformers_unsharded():
    torch.manual_seed(0)
    _check_llama4_block()


def test_expert_sharded_block_equals_unsharded():
    run_on_two_ranks(_check_rank)
