"""scripts/train_speculator.py on a tiny Llama: a few training steps write a checkpoint in TGI's
Medusa layout (one residual block per head, the base model's LM head shared) or IBM's MLP
speculator layout that pytgi loads as a speculator, with greedy outputs identical to the base
model's without speculation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pytgi.runtime.llm import LLM

SCRIPT = Path(__file__).parents[2] / "scripts" / "train_speculator.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_speculator", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _greedy(model_id: str, prompt: str) -> tuple[list[int], int]:
    """(greedy token ids, draft tokens per step the engine runs with)."""
    llm = LLM(model_id)
    try:
        (out,) = llm.generate([prompt], max_new_tokens=16, ignore_eos=True)
    finally:
        llm.close()
    return out.token_ids, llm.config.scheduler.num_speculative_tokens


PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def plain(tiny_model_factory) -> list[int]:
    """The tiny base model's greedy tokens for PROMPT, without speculation."""
    tokens, drafts = _greedy(str(tiny_model_factory("llama")), PROMPT)
    assert drafts == 0
    return tokens


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> Path:
    """The self-distilled rows file both tests pass (`--rows`): the second reads the first's."""
    return tmp_path_factory.mktemp("rows") / "rows.pt"


def _args(base: Path, out: Path, rows: Path) -> list[str]:
    paths = ["--base", str(base), "--out", str(out), "--rows", str(rows)]
    sizes = ["--heads", "2", "--max-prompts", "10", "--max-new-tokens", "12"]
    return [*paths, *sizes, "--epochs", "2", "--batch", "16"]


def test_trained_heads_load_and_keep_greedy_outputs(
    tiny_model_factory, tmp_path, capsys, plain, rows
):
    base = tiny_model_factory("llama")
    out = tmp_path / "medusa"
    assert _script().main(_args(base, out, rows)) == 0
    printed = capsys.readouterr().out
    assert "head 1 (token +3): top-1" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and config["medusa_num_layers"] == 1
    assert Path(config["base_model_name_or_path"]) == base.resolve()
    tensors = load_file(out / "medusa_lm_head.safetensors")
    assert sorted(tensors) == [f"{h}.0.linear.{p}" for h in range(2) for p in ("bias", "weight")]
    assert all(t.abs().sum() > 0 for t in tensors.values())  # trained away from the zero start
    speculated, drafts = _greedy(str(out), PROMPT)
    assert drafts == 2
    assert speculated == plain


def test_trained_mlp_speculator_loads_and_keeps_greedy_outputs(
    tiny_model_factory, tmp_path, capsys, plain, rows
):
    """`--kind mlp`: IBM's layout (tied weights: one emb/head/LN, proj.0 and proj.1), trained
    away from its start (the base model's embeddings, identity projections), loaded by pytgi as a
    speculator whose drafts are verified, with greedy outputs equal to the base model's; the
    rows of an earlier run with the same settings (`--rows`) are read, not recomputed."""
    base = tiny_model_factory("llama")
    out = tmp_path / "mlp"
    reused = rows.is_file()
    assert _script().main(["--kind", "mlp", *_args(base, out, rows)]) == 0
    assert ("rows read from" in capsys.readouterr().out) == reused
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "mlp_speculator" and config["n_predict"] == 2
    assert config["tie_weights"] and Path(config["base_model_name_or_path"]) == base.resolve()
    tensors = load_file(out / "model.safetensors")
    names = ["emb.0", "head.0", "ln.0", "proj.0", "proj.1"]
    assert {k.rsplit(".", 1)[0].removeprefix("speculator.") for k in tensors} == set(names)
    assert not torch.equal(tensors["speculator.proj.1.weight"], torch.eye(config["emb_dim"]))
    llm = LLM(str(out), speculation_policy="always")
    try:
        (speculated,) = llm.generate([PROMPT], max_new_tokens=16, ignore_eos=True)
        assert llm.core.stats().num_draft_tokens > 0
    finally:
        llm.close()
    assert speculated.token_ids == plain
