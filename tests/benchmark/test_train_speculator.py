"""scripts/train_speculator.py on a tiny Llama: a few training steps write a checkpoint in TGI's
Medusa layout (one residual block per head, the base model's LM head shared) that pytgi loads as
a speculator, with greedy outputs identical to the base model's without speculation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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


def test_trained_heads_load_and_keep_greedy_outputs(tiny_model_factory, tmp_path, capsys):
    base = tiny_model_factory("llama")
    out = tmp_path / "medusa"
    args = ["--base", str(base), "--out", str(out), "--heads", "2", "--max-prompts", "10"]
    assert _script().main([*args, "--max-new-tokens", "12", "--epochs", "2", "--batch", "16"]) == 0
    printed = capsys.readouterr().out
    assert "head 1 (token +3): top-1" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["medusa_num_heads"] == 2 and config["medusa_num_layers"] == 1
    assert Path(config["base_model_name_or_path"]) == base.resolve()
    tensors = load_file(out / "medusa_lm_head.safetensors")
    assert sorted(tensors) == [f"{h}.0.linear.{p}" for h in range(2) for p in ("bias", "weight")]
    assert all(t.abs().sum() > 0 for t in tensors.values())  # trained away from the zero start
    prompt = "The quick brown fox jumps over"
    speculated, drafts = _greedy(str(out), prompt)
    plain, no_drafts = _greedy(str(base), prompt)
    assert (drafts, no_drafts) == (2, 0)
    assert speculated == plain
