"""The MoE layer against transformers' own modules: each family's router (selected experts and
weights) and whole sparse blocks (routing, grouped experts, shared expert) on random weights;
routing ties against a plain per-token reference."""

from __future__ import annotations

import pytest
import torch
import transformers
from layers.moe_utils import load_experts, load_shared_expert, per_token_experts

from pytgi.layers.moe.block import SparseMoeBlock
from pytgi.layers.moe.config import GROUP_LIMITED, NOAUX_TC, SPARSEMIXER, MoEConfig
from pytgi.layers.moe.router import select_experts

HIDDEN = 16


def _sorted(weights: torch.Tensor, ids: torch.Tensor):
    """(weights, ids) [T, k] in ascending expert order per token (selection order is free)."""
    ids, order = ids.sort(dim=-1)
    return weights.gather(1, order), ids


def _assert_same_routing(ours, theirs):
    (w, i), (w_ref, i_ref) = _sorted(*ours), _sorted(*theirs)
    assert torch.equal(i, i_ref)
    torch.testing.assert_close(w, w_ref.float())


def _load_block(block: SparseMoeBlock, hf_block, names=("gate_proj", "up_proj", "down_proj")):
    """Our block's parameters from transformers' module (per-expert tensors)."""
    gate, up, down = names
    block.gate.weight.copy_(hf_block.gate.weight)
    if block.gate.e_score_correction_bias is not None:
        block.gate.e_score_correction_bias.copy_(hf_block.gate.e_score_correction_bias)
    experts = hf_block.experts
    load_experts(
        block.experts,
        [getattr(expert, gate).weight for expert in experts],
        [getattr(expert, up).weight for expert in experts],
        [getattr(expert, down).weight for expert in experts],
    )
    hf_shared = getattr(hf_block, "shared_expert", None) or getattr(
        hf_block, "shared_experts", None
    )
    if hf_shared is not None:
        shared = (hf_shared.gate_proj, hf_shared.up_proj, hf_shared.down_proj)
        load_shared_expert(block.shared_experts, *(linear.weight for linear in shared))
    if block.shared_expert_gate is not None:
        block.shared_expert_gate.weight.copy_(hf_block.shared_expert_gate.weight)


def _randomize(module):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        for name, buffer in module.named_buffers():
            if "correction_bias" in name:
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    return module.eval()


BLOCKS = {
    "mixtral": (
        "MixtralConfig",
        "mixtral.modeling_mixtral.MixtralSparseMoeBlock",
        dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=24),
        MoEConfig(num_experts=8, top_k=2, intermediate_size=24),
        ("w1", "w3", "w2"),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        dict(
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            shared_expert_intermediate_size=40,
            norm_topk_prob=False,
        ),
        MoEConfig(
            num_experts=6,
            top_k=2,
            intermediate_size=24,
            renormalize=False,
            shared_intermediate_size=40,
            shared_expert_gate=True,
        ),
        ("gate_proj", "up_proj", "down_proj"),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
        dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=True),
        MoEConfig(num_experts=8, top_k=3, intermediate_size=24),
        ("gate_proj", "up_proj", "down_proj"),
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        "deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
        dict(
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        ),
        MoEConfig(
            num_experts=8,
            top_k=2,
            intermediate_size=24,
            router=NOAUX_TC,
            scaling_factor=2.5,
            num_groups=4,
            topk_groups=2,
            score_correction_bias=True,
            shared_intermediate_size=48,
        ),
        ("gate_proj", "up_proj", "down_proj"),
    ),
}


def _hf_module(config_name: str, path: str, overrides: dict):
    import importlib

    config = getattr(transformers, config_name)(hidden_size=HIDDEN, **overrides)
    module_path, class_name = path.rsplit(".", 1)
    module = importlib.import_module(f"transformers.models.{module_path}")
    return _randomize(getattr(module, class_name)(config))


@pytest.mark.parametrize("family", list(BLOCKS))
@torch.no_grad()
def test_sparse_block_matches_transformers(family):
    config_name, path, overrides, moe, names = BLOCKS[family]
    hf_block = _hf_module(config_name, path, overrides)
    block = SparseMoeBlock(moe, HIDDEN, None, "mlp")
    _load_block(block, hf_block, names)
    x = torch.randn(1, 13, HIDDEN)
    expected = hf_block(x)
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(block(x[0]), expected[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_deepseek_v2_group_limited_router_matches_transformers():
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2MoEGate

    config = transformers.DeepseekV2Config(
        hidden_size=HIDDEN,
        n_routed_experts=12,
        num_experts_per_tok=3,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.7,
    )
    gate = _randomize(DeepseekV2MoEGate(config))
    x = torch.randn(1, 21, HIDDEN)
    moe = MoEConfig(
        num_experts=12,
        top_k=3,
        intermediate_size=8,
        router=GROUP_LIMITED,
        renormalize=False,
        scaling_factor=1.7,
        num_groups=4,
        topk_groups=2,
    )
    ids, weights = gate(x)
    _assert_same_routing(select_experts(x[0] @ gate.weight.t(), moe), (weights, ids))


@torch.no_grad()
def test_deepseek_v3_router_uses_the_bias_for_selection_only():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = transformers.DeepseekV3Config(
        hidden_size=HIDDEN,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    router = _randomize(DeepseekV3TopkRouter(config))
    moe = MoEConfig(
        num_experts=16,
        top_k=4,
        intermediate_size=8,
        router=NOAUX_TC,
        scaling_factor=2.5,
        num_groups=4,
        topk_groups=2,
        score_correction_bias=True,
    )
    x = torch.randn(1, 21, HIDDEN)
    ids, weights = router(x)
    bias = router.e_score_correction_bias
    ours = select_experts(x[0] @ router.weight.t(), moe, bias)
    _assert_same_routing(ours, (weights, ids))
    # the bias changes which experts win, never the weights' values (the unbiased scores)
    w, i = ours
    scores = (x[0] @ router.weight.t()).sigmoid()
    picked = scores.gather(1, i)
    torch.testing.assert_close(w, picked / picked.sum(-1, keepdim=True) * 2.5)


@torch.no_grad()
def test_phimoe_sparsemixer_matches_transformers():
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    logits = torch.randn(37, 8) * 2
    logits[0, 3] = logits[0, 5] = logits[0].max() + 1  # a tie for the first pick
    moe = MoEConfig(
        num_experts=8, top_k=2, intermediate_size=8, router=SPARSEMIXER, jitter_eps=0.01
    )
    weights, ids = sparsemixer(logits, jitter_eps=0.01, training=False)
    ours = select_experts(logits, moe)
    assert torch.equal(ours[1], ids)
    torch.testing.assert_close(ours[0], weights)


@torch.no_grad()
def test_ties_and_grouped_execution_match_a_per_token_reference():
    """Tied logits (several experts equal): whatever experts topk keeps, the weights are the tied
    probabilities and the grouped execution equals a per-token loop over the same choice."""
    moe = MoEConfig(num_experts=4, top_k=2, intermediate_size=8)
    block = _randomize(SparseMoeBlock(moe, HIDDEN, None, "mlp"))
    x = torch.randn(9, HIDDEN)
    logits = torch.zeros(9, 4)
    logits[:3] = torch.tensor([1.0, 1.0, 1.0, 0.0])  # three-way tie for two places
    logits[3:] = torch.randn(6, 4)
    weights, ids = select_experts(logits, moe)
    assert torch.allclose(weights[:3], torch.full((3, 2), 0.5))
    assert all(set(row) <= {0, 1, 2} and len(set(row)) == 2 for row in ids[:3].tolist())
    experts = block.experts
    gate, up = experts.w13_weight.chunk(2, dim=1)  # [E, I, H] each
    expected = per_token_experts(x, weights, ids, gate, up, experts.w2_weight)
    torch.testing.assert_close(experts(x, weights, ids), expected, atol=1e-5, rtol=1e-5)


def test_bad_router_config_is_refused():
    from pytgi.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="num_experts_per_tok"):
        MoEConfig(num_experts=4, top_k=5, intermediate_size=8)
    with pytest.raises(ModelLoadError, match="grouping"):
        MoEConfig(num_experts=6, top_k=2, intermediate_size=8, num_groups=4)


@torch.no_grad()
def test_dbrx_router_divides_by_the_p_norm():
    from transformers.models.dbrx.modeling_dbrx import DbrxRouter

    router = _randomize(DbrxRouter(HIDDEN, 6, 3, None, moe_normalize_expert_weights=2.0))
    moe = MoEConfig(num_experts=6, top_k=3, intermediate_size=8, renormalize_p=2.0)
    x = torch.randn(1, 11, HIDDEN)
    _, weights, ids = router(x)
    _assert_same_routing(select_experts(x[0] @ router.layer.weight.t(), moe), (weights, ids))
