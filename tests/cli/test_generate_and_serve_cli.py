"""The CLI through its real entry points: `pytgi generate` on the bundled demo model and on other
model families, and the launcher's start-up errors (TGI's texts) before any model is loaded.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pytgi.cli.main import launcher_main, main


def test_generate_streams_demo_model_text():
    result = subprocess.run(
        [sys.executable, "-m", "pytgi", "generate", "And God said", "--max-new-tokens", "12",
         "--num-threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("And God said")
    assert len(result.stdout.split()) > 5
    assert "finish_reason" in result.stderr


def test_generate_rejects_bad_sampling_flags(capsys):
    assert main(["generate", "hi", "--temperature", "0"]) == 1
    assert "temperature" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-input-tokens", "10", "--max-total-tokens", "5"],
         "`max_input_tokens`(10) must be < `max_total_tokens`(5)"),
        (["--max-input-tokens", "10", "--max-input-length", "10"],
         "Both `max_input_tokens` (10) and `max_input_length` (10) are set."),
        (["--max-total-tokens", "100", "--max-batch-total-tokens", "50"],
         "`max_total_tokens` must be <= `max_batch_total_tokens`. Given: 100 and 50"),
        (["--validation-workers", "0"], "`validation_workers` must be > 0"),
        (["--max-batch-size", "0"], "`max_batch_size` must be > 0"),
        (["--sharded", "true", "--num-shard", "1"], "`sharded` is true but `num_shard` <= 1"),
        (["--quantize", "gptq"], "--quantize gptq is not supported yet"),
    ],
)  # fmt: skip
def test_launcher_start_up_errors(flags, message, capsys):
    assert launcher_main(flags) == 1
    assert message in capsys.readouterr().err


def test_missing_model_directory_is_a_clear_error(capsys, tmp_path):
    assert main(["serve", "--model-id", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["gemma2", "gpt2"])
def test_generate_serves_model_families(arch, tiny_model_factory):
    """`pytgi generate` on checkpoints of other families (Gemma 2: sandwich blocks, soft-capping,
    alternating sliding windows; GPT-2: learned positions, Conv1D weights, LayerNorm, a plain
    MLP): transformers' greedy text."""
    from models.runner_utils import load_hf
    from tokenizers import Tokenizer

    model_dir = tiny_model_factory(arch)
    text = "The quick brown fox"
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tokenizer.encode(text).ids
    out = load_hf(model_dir).generate(
        torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=3
    )
    expected = text + tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
    result = subprocess.run(
        [sys.executable, "-m", "pytgi", "generate", text, "--model-id", str(model_dir),
         "--max-new-tokens", "16", "--ignore-eos", "--num-threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected + "\n"
