"""The CLI through its real entry points: `pytgi generate` on the bundled demo model and on other
model families, and the launcher's start-up errors (TGI's texts) before any model is loaded.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from pytgi.cli.main import launcher_main, main
from pytgi.version import __version__


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
        (["--quantize", "exl2"], "--quantize exl2 is not supported on CPU by pytgi (supported: "
         "eetq, bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, fp8, gptq, awq, "
         "compressed-tensors, marlin)"),
        (["--quantize", "gptq"], "--quantize gptq needs a checkpoint already quantized with gptq"),
        (["--quantize", "eetq", "--dtype", "bfloat16"],
         "--quantize eetq runs its kernels on float32 activations on CPU: use --dtype float32 "
         "(got bfloat16)"),
    ],
)  # fmt: skip
def test_launcher_start_up_errors(flags, message, capsys):
    assert launcher_main(flags) == 1
    assert message in capsys.readouterr().err


def test_quantize_is_refused_when_the_engine_would_run_on_cuda(capsys, monkeypatch):
    monkeypatch.setenv("PYTGI_DEVICE", "cuda")
    assert launcher_main(["--quantize", "bitsandbytes"]) == 1
    assert ("--quantize bitsandbytes runs on pytgi's CPU kernels only, and the engine would run "
            "on cuda (PYTGI_DEVICE=cpu serves it; cuda serves gptq, awq, compressed-tensors, fp8, "
            "eetq, bitsandbytes-nf4, bitsandbytes-fp4)") in capsys.readouterr().err  # fmt: skip


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


def test_family_option_pytgi_does_not_compute_is_one_line(tiny_model_factory):
    """A native family's config option pytgi does not compute (GPT-2's per-layer attention
    scaling): refused when the model is built, before any weight is read, in one line."""
    model_dir = tiny_model_factory("gpt2", scale_attn_by_inverse_layer_idx=True)
    result = subprocess.run(
        [sys.executable, "-m", "pytgi", "generate", "hi", "--model-id", str(model_dir),
         "--max-new-tokens", "2", "--num-threads", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "[model: GPT2LMHeadModel (native implementation)]",
        "error: GPT2LMHeadModel with scale_attn_by_inverse_layer_idx is not supported",
    ]


def _serve(*flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`pytgi serve` as a user runs it: every process's output, and the time it took."""
    return subprocess.run(
        [sys.executable, "-m", "pytgi", "serve", "--hostname", "127.0.0.1", *flags],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if " ERROR " in line]


def _model_dir_without_weights(path, demo_model_dir, **config_updates):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir / name, path / name)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **config_updates}))
    return path


def test_unsupported_architecture_is_one_line_before_the_engine(tmp_path, demo_model_dir):
    model_dir = _model_dir_without_weights(  # neither native nor in transformers' table
        tmp_path, demo_model_dir, architectures=["NoSuchModelForCausalLM"]
    )
    shutil.copy(demo_model_dir / "model.safetensors", model_dir / "model.safetensors")
    result = _serve("--model-id", str(tmp_path))
    assert result.returncode == 1
    errors = _error_lines(result)
    assert len(errors) == 1, result.stderr
    assert "unsupported model architecture ['NoSuchModelForCausalLM']" in errors[0]
    assert "LlamaForCausalLM" in errors[0] and "transformers fallback" in errors[0]
    assert "Traceback" not in result.stderr
    assert "Engine" not in result.stderr  # refused before the engine process started


def test_directory_without_weights_is_one_line_before_the_engine(tmp_path, demo_model_dir):
    _model_dir_without_weights(tmp_path, demo_model_dir)
    result = _serve("--model-id", str(tmp_path))
    assert result.returncode == 1
    errors = _error_lines(result)
    assert len(errors) == 1, result.stderr
    assert f"No safetensors weights found in {tmp_path}" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_busy_port_is_reported_before_the_model_loads():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _serve("--port", str(port))
    assert result.returncode == 1
    errors = _error_lines(result)
    assert len(errors) == 1 and f"Cannot listen on 127.0.0.1:{port}" in errors[0], result.stderr
    assert "Resolved" not in result.stderr  # nothing was loaded


@pytest.mark.parametrize(
    "argv", [["pytgi", "-V"], ["pytgi", "serve", "--version"], ["text-generation-launcher", "-V"]]
)
def test_version_flags(argv, capsys):
    entry = main if argv[0] == "pytgi" else launcher_main
    with pytest.raises(SystemExit) as exit_info:
        entry(argv[1:])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"pytgi {__version__}"


def test_help_shows_defaults_and_what_quantize_serves(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Tokens per KV block [default: 16] [env: BLOCK_SIZE]" in text
    assert "Concurrent requests before 429 [default: 128]" in text
    assert "pytgi runs eetq, bitsandbytes, bitsandbytes-nf4, bitsandbytes-fp4, fp8 on CPU" in text


def test_env_flag_logs_the_runtime_environment():
    with socket.socket() as busy:  # the busy port ends the launcher right after `--env`
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = _serve("--env", "--port", str(busy.getsockname()[1]))
    assert "Runtime environment:" in result.stderr
    assert f"pytgi: {__version__}" in result.stderr
    assert "torch: " in result.stderr and "CPU capability: " in result.stderr


def _engine_config(*flags: str):
    from pytgi.cli import configs
    from pytgi.cli.main import build_parser

    args = build_parser().parse_args(["serve", *flags])
    return configs.engine_config(args, configs.model_config(args))


def test_cpu_serving_uses_the_measured_step_budget():
    from pytgi.cli.configs import default_max_batch_prefill_tokens

    assert _engine_config().scheduler.max_batch_prefill_tokens == 1024
    explicit = _engine_config("--max-batch-prefill-tokens", "2048")
    assert explicit.scheduler.max_batch_prefill_tokens == 2048
    # a prompt must fit in one step without chunking, and GPUs keep TGI's default
    unchunked = _engine_config("--disable-prefill-chunking")
    assert unchunked.scheduler.max_batch_prefill_tokens == 4096
    assert default_max_batch_prefill_tokens("cuda") == 4096
