"""Trained speculators (Medusa, MLP speculator) in their real checkpoint layouts: detected from
`--model-id` as TGI does, drafts computed as TGI's heads compute them, and outputs (greedy and
seeded) identical to the base model without speculation; sampled tokens follow the target
distribution (chi-square over many seeds)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from fixtures.speculators import make_medusa, make_mlp_speculator
from models.runner_utils import prompt

from pytgi.config import ModelConfig
from pytgi.errors import ConfigError
from pytgi.messages.sampling_params import SamplingParams
from pytgi.models.resolve import resolve_speculator
from pytgi.models.speculators import MLPSpeculator
from pytgi.runtime.llm import LLM

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def base(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def plain_outputs(base):
    """The base model without speculation: greedy and seeded outputs of PROMPTS."""
    torch.set_num_threads(1)
    llm = LLM(str(base), num_blocks=128)
    try:
        return {name: generate(llm, params) for name, params in PARAMS.items()}
    finally:
        llm.close()


PROMPTS = [prompt(9, 1), prompt(17, 2), prompt(4, 3)]
PARAMS = {
    "greedy": SamplingParams(),
    "seeded": SamplingParams(do_sample=True, temperature=0.8, top_k=20, seed=7),
}


def generate(llm, params):
    outs = llm.generate(PROMPTS, params, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    return [o.token_ids for o in outs]


CHECKPOINTS = {
    "medusa": lambda b, d: make_medusa(b, d, heads=3, layers=1),
    "medusa-2-layers-shared-head": lambda b, d: make_medusa(
        b, d, heads=2, layers=2, own_lm_head=False
    ),
    "mlp": lambda b, d: make_mlp_speculator(b, d, n_predict=3),
    "mlp-tied-scaled": lambda b, d: make_mlp_speculator(
        b, d, n_predict=4, tie_weights=True, scale_input=True
    ),
}


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
def test_outputs_equal_no_speculation(kind, base, plain_outputs, tmp_path):
    torch.set_num_threads(1)
    directory = CHECKPOINTS[kind](base, tmp_path / kind)
    llm = LLM(str(directory), num_blocks=128, speculation_policy="always")
    try:
        assert llm.config.model.speculator is not None
        assert llm.config.scheduler.num_speculative_tokens == llm.config.model.speculator.num_heads
        for name, params in PARAMS.items():
            assert generate(llm, params) == plain_outputs[name], name
        assert llm.core.scheduler.num_draft_tokens > 0  # the heads drafted and were verified
    finally:
        llm.close()


def test_speculate_above_the_heads_is_refused(base, tmp_path):
    directory = make_medusa(base, tmp_path / "m", heads=2)
    with pytest.raises(ConfigError, match="only has `2` heads"):
        resolve_speculator(ModelConfig(model_id=str(directory)), 3)
    served, speculate = resolve_speculator(ModelConfig(model_id=str(directory)), 1)
    assert (served.model_id, speculate) == (str(base), 1)
    assert resolve_speculator(ModelConfig(model_id=str(base)), None)[1] is None  # n-gram


def test_mlp_speculator_follows_tgi_formula(base, tmp_path):
    """The chain as TGI's MLPSpeculatorModel writes it, step by step, for the untied layout."""
    import json

    from safetensors.torch import load_file

    directory = make_mlp_speculator(base, tmp_path / "mlp", n_predict=3, inner_dim=48)
    t = load_file(directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())
    hidden, tokens = torch.randn(5, 64), torch.randint(0, 384, (5,))
    drafts = MLPSpeculator(t, config).propose(hidden, tokens, 3)
    state_weight = 0.5 ** (0.5 / 3)
    emb_weight = math.sqrt(1 - state_weight**2) * math.sqrt(48 / 2)
    state, ind = hidden, tokens
    for i in range(3):
        z = t[f"speculator.emb.{i}.weight"][ind] * emb_weight
        state = state @ t[f"speculator.proj.{i}.weight"].T * state_weight + z
        norm = state * torch.rsqrt(state.pow(2).mean(-1, keepdim=True) + 1e-6)
        state = torch.nn.GELU()(
            norm * t[f"speculator.ln.{i}.weight"] + t[f"speculator.ln.{i}.bias"]
        )
        ind = (state @ t[f"speculator.head.{i}.weight"].T).argmax(-1)
        assert torch.equal(drafts[:, i], ind)


def test_sampling_keeps_the_target_distribution(base, tmp_path):
    """Over many seeds, the token drawn at a verified draft row follows the target model's own
    distribution there (chi-square), not the draft's."""
    torch.set_num_threads(1)
    directory = make_medusa(base, tmp_path / "m", heads=2)
    ids = prompt(6, 11)
    llm = LLM(str(directory), num_blocks=256, speculation_policy="always")
    try:
        params = [
            SamplingParams(do_sample=True, temperature=1.5, top_k=4, seed=s) for s in range(240)
        ]
        outs = llm.generate([ids] * len(params), params, max_new_tokens=3, ignore_eos=True)
        assert llm.core.scheduler.num_draft_tokens > 0
    finally:
        llm.close()
    first = Counter(o.token_ids[0] for o in outs)
    t1 = first.most_common(1)[0][0]
    seconds = Counter(o.token_ids[1] for o in outs if o.token_ids[0] == t1)
    n = sum(seconds.values())
    from models.runner_utils import load_hf

    hf = load_hf(base)
    with torch.no_grad():
        logits = hf(torch.tensor([ids + [t1]])).logits[0, -1] / 1.5
    top = torch.topk(logits, 4)
    probs = dict(zip(top.indices.tolist(), torch.softmax(top.values, -1).tolist(), strict=True))
    assert set(seconds) <= set(probs)
    chi2 = sum((seconds.get(t, 0) - n * p) ** 2 / (n * p) for t, p in probs.items())
    assert chi2 < 16.27, (chi2, seconds, probs)  # 3 degrees of freedom, p = 0.001


def test_a_speculator_with_several_shards_is_refused(base, tmp_path):
    """pytgi runs the heads on one rank: --num-shard > 1 with a speculator fails at load."""
    from dataclasses import replace

    from pytgi.config import EngineConfig
    from pytgi.distributed.parallel_state import TPInfo
    from pytgi.worker.model_runner import ModelRunner

    model, _ = resolve_speculator(
        ModelConfig(model_id=str(make_medusa(base, tmp_path / "m"))), None
    )
    runner = ModelRunner.__new__(ModelRunner)
    runner.config = EngineConfig(model=model)
    runner.tp = replace(TPInfo(0, 1), world_size=2)
    with pytest.raises(ConfigError, match="one shard only"):
        runner._load_speculator()
