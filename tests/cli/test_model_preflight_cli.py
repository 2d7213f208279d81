"""The real CLI on checkpoints pytgi cannot serve through its transformers fallback: `pytgi serve`
and `pytgi generate` refuse them before any engine starts (or, for what needs the model class, in
the engine before any weight is read), in one line without a traceback; and `pytgi generate`
says which implementation serves a model (here OLMo 2, through the fallback).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from e2e.server import free_port

from pytgi.cli.main import main

TIMEOUT_S = 120


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env_cmd = [sys.executable, "-m", "pytgi", *args]
    return subprocess.run(env_cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def edited_copy(src, dst, **config_changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.fixture(scope="module")
def bad_models(tiny_model_factory, tmp_path_factory):
    """name -> (model directory, extra flags, the refusal's text)."""
    root = tmp_path_factory.mktemp("bad-models")
    llama, olmo2 = tiny_model_factory("llama"), tiny_model_factory("olmo2")
    no_weights = edited_copy(llama, root / "no-weights")
    (no_weights / "model.safetensors").unlink()
    return {
        "unsupported": (
            edited_copy(llama, root / "unsupported", architectures=["NoSuchModelForCausalLM"]),
            [],
            "unsupported model architecture ['NoSuchModelForCausalLM']",
        ),
        "no weights": (no_weights, [], "No safetensors weights found in"),
        "fallback sharded": (
            olmo2,
            ["--num-shard", "2"],
            "Olmo2ForCausalLM runs on the transformers fallback, which does not shard",
        ),
        "recurrent": (
            edited_copy(olmo2, root / "recurrent", layer_types=["mamba", "full_attention"]),
            [],
            "serves models whose every layer is attention",
        ),
    }


def assert_refused_before_the_engine(stderr: str, message: str) -> None:
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0], stderr
    assert "Traceback" not in stderr
    assert not any(name in stderr for name in ("pytgi.engine", "pytgi.worker", "loaded "))


@pytest.mark.parametrize("case", ["fallback sharded", "recurrent"])
def test_serve_refuses_before_the_engine_starts(case, bad_models, capsys):
    """The fallback's limits, through the CLI entry point in this process (test_generate_and_serve
    runs the launcher process on an unsupported architecture and on missing weights)."""
    model_dir, flags, message = bad_models[case]
    assert main(["serve", "--model-id", str(model_dir), "--port", str(free_port()), *flags]) == 1
    assert_refused_before_the_engine(capsys.readouterr().err, message)


def test_generate_process_refuses_in_one_line(bad_models):
    model_dir, _, message = bad_models["unsupported"]
    result = run_cli("generate", "hi", "--model-id", str(model_dir))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {result.stderr.strip()[7:]}"]
    assert message in result.stderr and "Traceback" not in result.stderr


def test_generate_refuses_missing_weights(bad_models, capsys):
    model_dir, _, message = bad_models["no weights"]
    assert main(["generate", "hi", "--model-id", str(model_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and message in err


def test_serve_refuses_a_model_the_fallback_cannot_build_in_one_line(tiny_model_factory, tmp_path):
    """Mamba is in transformers' causal-LM table but has no attention layers: refused by the
    fallback's build in the engine process, before any weight is read, still in one line."""
    model_dir = tmp_path / "mamba"
    shutil.copytree(tiny_model_factory("llama"), model_dir)
    config = {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "vocab_size": 384,
              "hidden_size": 64, "num_hidden_layers": 2, "state_size": 4,
              "max_position_embeddings": 512}  # fmt: skip
    (model_dir / "config.json").write_text(json.dumps(config))
    result = run_cli("serve", "--model-id", str(model_dir), "--port", str(free_port()))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "does not take custom attention functions" in errors[0]
    assert "Traceback" not in result.stderr


def test_generate_names_the_fallback(tiny_model_factory):
    result = run_cli(
        "generate", "The quick brown fox", "--model-id", str(tiny_model_factory("olmo2")),
        "--max-new-tokens", "8", "--ignore-eos", "--num-threads", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "[model: Olmo2ForCausalLM (transformers fallback implementation)]" in result.stderr
    assert result.stdout.startswith("The quick brown fox")
    assert len(result.stdout) > len("The quick brown fox\n")
