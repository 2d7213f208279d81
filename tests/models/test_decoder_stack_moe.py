"""The fused CPU decode stack's mixture-of-experts MLP (csrc/moe_stack.h) against the same model
run layer by layer: Mixtral (softmax over the top-k, renormalised), Qwen2-MoE (not renormalised,
a sigmoid-gated shared expert, a dense layer among the sparse ones) and Qwen3-MoE (top-3 of 8,
renormalised), on decode steps of 9 rows; ties in the routing (a zero router: every expert tied)
broken as the layer-by-layer path's torch.topk breaks them; and the rules and layouts the stack
leaves layer by layer, each with its reason. Parity with transformers is test_moe_models.py's
job (its decode steps run fused too)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from models.runner_utils import make_runner
from models.test_decoder_stack import (
    check_fused_matches_layer_by_layer,
    decode_step,
    prefilled,
)

from pytgi.backends.cpu.fused_decode import FusedDecodeStack, unsupported_features
from pytgi.backends.cpu.kernels import load_cpu_kernels
from pytgi.layers.moe.config import GROUP_LIMITED, NOAUX_TC, SIGMOID_TOPK, SPARSEMIXER

FUSED_MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


@pytest.fixture(scope="module", params=FUSED_MOE_ARCHS)
def runner(request, tiny_model_factory):
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
    return make_runner(tiny_model_factory(request.param))


def moe_layers(runner) -> list[int]:
    return [
        i for i, (_, tensors) in enumerate(runner.model.fused_decode_layers())
        if "moe.gate_up" in tensors
    ]  # fmt: skip


def test_moe_layers_run_fused_and_match_layer_by_layer(runner, monkeypatch):
    assert runner.accelerator is not None, "the fused decode stack refused the MoE model"
    assert moe_layers(runner), "no layer handed its experts to the stack"
    check_fused_matches_layer_by_layer(runner, monkeypatch)


def test_fused_moe_is_the_same_on_any_number_of_threads(runner):
    if runner.spec.moe.shared_intermediate_size == 0:
        pytest.skip("Qwen2-MoE (shared expert, a dense layer) runs every phase")
    seqs = prefilled(runner)
    outputs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outputs.append(runner.forward(decode_step(seqs)))
    torch.set_num_threads(1)
    assert torch.equal(outputs[0], outputs[1])


def test_routing_ties_break_as_the_layer_by_layer_path(runner):
    """A zero router gives every expert the same probability: both paths must keep the experts
    torch.topk keeps (not the lowest indices: ATen's CPU topk leaves ties in the order its
    std::nth_element / std::partial_sort leave them), else their outputs differ."""
    gates = [runner.model.model.layers[i].mlp.gate for i in moe_layers(runner)]
    saved = [(gate.weight.data.clone(), gate.weight_packed.clone()) for gate in gates]
    for gate in gates:  # the stacks hold the same packed tensor: zeroed for them too
        gate.weight.data.zero_()
        gate.weight_packed.zero_()
    accelerator = runner.accelerator
    try:
        runner.accelerator = FusedDecodeStack.for_model(runner.model, load_cpu_kernels())
        seqs = prefilled(runner)
        reference = runner.forward(decode_step(seqs))  # the stack's, fused
        assert torch.equal(runner.forward(decode_step(seqs)), reference)
        fused = runner.accelerator
        runner.accelerator = None
        layer_by_layer = runner.forward(decode_step(seqs))
        runner.accelerator = fused
        assert (reference - layer_by_layer).abs().max().item() <= 1e-5
    finally:
        runner.accelerator = accelerator
        for gate, (weight, packed) in zip(gates, saved, strict=True):
            gate.weight.data.copy_(weight)
            gate.weight_packed.copy_(packed)


def test_torch_topk_does_not_break_ties_by_lowest_index():
    """The fact the kernel's tie-breaking copies (see the test above): were it lowest index
    first, a plain stable sort would do."""
    assert torch.zeros(1, 4).topk(2).indices.tolist() != [[0, 1]]


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(router=GROUP_LIMITED, num_groups=2, topk_groups=1), "router group_limited_greedy"),
        (dict(router=NOAUX_TC, scaling_factor=2.5), "router noaux_tc, routed scaling factor 2.5"),
        (dict(router=SPARSEMIXER, top_k=2, jitter_eps=0.01), "router sparsemixer"),
        (dict(router=SIGMOID_TOPK, top_k=1, scale_input=True), "router sigmoid_topk, expert"),
        (dict(renormalize_p=2.0), "p-norm renormalisation (p=2.0)"),
    ],
)
def test_routing_rules_the_kernel_lacks_stay_layer_by_layer(runner, change, reason):
    if runner.spec.architecture != "MixtralForCausalLM":
        pytest.skip("one spec is enough")
    spec = runner.spec
    spec = dataclasses.replace(spec, moe=dataclasses.replace(spec.moe, **change))
    reasons = unsupported_features(spec)
    assert len(reasons) == 1 and reasons[0].startswith(f"moe ({reason}"), reasons


def test_phimoe_is_refused_with_its_reason(tiny_model_factory, caplog):
    with caplog.at_level(logging.INFO, logger="pytgi.backends.cpu.fused_decode"):
        runner = make_runner(tiny_model_factory("phimoe"), num_blocks=8)
    assert runner.accelerator is None
    assert "moe (router sparsemixer)" in caplog.text


def test_quantized_experts_stay_layer_by_layer(tiny_model_factory, caplog):
    with caplog.at_level(logging.INFO, logger="pytgi.backends.cpu.fused_decode"):
        runner = make_runner(
            tiny_model_factory("mixtral"), num_blocks=8, quantize="eetq",
            quantize_activations="int8",
        )  # fmt: skip
    assert runner.accelerator is None
    assert "MoE experts: fp32 tiles only" in caplog.text


def test_the_stacks_router_name_is_the_layers_softmax_topk():
    """backends/cpu/fused_decode.py names the rule it computes without importing layers/."""
    from pytgi.backends.cpu.fused_decode import MOE_ROUTER
    from pytgi.layers.moe.config import SOFTMAX_TOPK

    assert MOE_ROUTER == SOFTMAX_TOPK
