"""A tiny DeepSeek-V3 (q_lora_rank set, dense first layer, shared expert) stored as DeepSeek
ships V3 / R1: every linear block-wise FP8 (e4m3, `weight_scale_inv` per 128 x 128 block) -- the
latent-attention projections q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj, the
dense MLP, the shared and the routed experts -- with only the embeddings, norms, router and LM
head in full precision. It loads (kv_b_proj dequantized once, the rest on the pre-quantized FP8
path) and its logits and greedy tokens equal transformers' eager forward on the dequantized
weights (transformers 4.57 refuses FP8 checkpoints without a GPU), in mixed batches with chunked
prefill."""

from __future__ import annotations

import pytest
import torch
from fixtures.prequantized import DEEPSEEK_FP8_OVERRIDES, write_deepseek_fp8
from models.runner_utils import load_hf, make_runner
from models.test_parity import (  # noqa: F401 (collected here with this module's `pair`)
    test_chunked_prefill_mixed_with_decode,
    test_greedy_decode_matches_generate,
    test_mixed_prompts_in_one_step,
)


@pytest.fixture(scope="module")
def checkpoints(tiny_model_factory, tmp_path_factory):
    source = tiny_model_factory("deepseek_v3", **DEEPSEEK_FP8_OVERRIDES)
    return write_deepseek_fp8(source, tmp_path_factory.mktemp("deepseek-fp8"))


@pytest.fixture(scope="module")
def pair(checkpoints):
    torch.set_num_threads(1)
    fp8_dir, reference_dir = checkpoints
    return "deepseek_v3-fp8", make_runner(fp8_dir), load_hf(reference_dir)


def test_every_linear_but_router_and_head_is_fp8(pair, checkpoints):
    from safetensors.torch import load_file

    _, runner, hf = pair
    fp8 = load_file(checkpoints[0] / "model.safetensors")
    assert fp8["model.layers.0.self_attn.kv_b_proj.weight"].dtype == torch.float8_e4m3fn
    assert fp8["model.layers.0.self_attn.kv_b_proj.weight_scale_inv"].shape == (2, 1)
    assert fp8["model.layers.0.mlp.down_proj.weight_scale_inv"].shape == (1, 2)
    assert fp8["model.layers.2.mlp.gate.weight"].dtype == torch.float32

    def method(module) -> str:
        return type(getattr(module, "quant_method", None)).__name__

    dense, moe = runner.model.model.layers[0], runner.model.model.layers[-1]
    for module in (
        dense.self_attn.q_a_proj,
        dense.self_attn.q_b_proj,
        dense.self_attn.kv_a_proj_with_mqa,
        dense.self_attn.o_proj,
        dense.mlp.gate_up_proj,
        dense.mlp.down_proj,
        moe.mlp.shared_experts.gate_up_proj,
        moe.mlp.experts[0].gate_up_proj,
        moe.mlp.experts[0].down_proj,
    ):
        assert method(module) == "PrequantizedLinearMethod"
    assert method(runner.model.lm_head) != "PrequantizedLinearMethod"
    # kv_b_proj: dequantized once at load, equal to the reference's (the format's own rule)
    expected = hf.model.layers[0].self_attn.kv_b_proj.weight
    assert torch.equal(dense.self_attn.kv_b_proj.weight, expected)
