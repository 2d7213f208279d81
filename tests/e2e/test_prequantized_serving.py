"""Pre-quantized checkpoints through the real server: a tiny Llama stored as GPTQ (4-bit
asymmetric, act-order, checkpoint format v1, on two tensor-parallel ranks), AWQ (GEMM),
compressed-tensors W4A16 (written by the library's own compressor) and FP8 with DeepSeek-style
block scales, each with its producer's config (transformers' config classes, compressed-tensors'
QuantizationConfig). The server finds the method on its own, names it in /info, and its greedy
tokens equal transformers' eager forward on the format's dequantised weights. What pytgi cannot
serve ends the launcher in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import httpx
import pytest
import torch
import transformers
from fixtures.prequantized import build_checkpoint
from text_generation import Client

from e2e.server import ServerProcess, free_port

PROMPTS = ["Hello world", "The quick brown fox", "1 2 3"]
NEW_TOKENS = 10


def transformers_greedy(model_dir, reference: dict, prompts_ids: list[list[int]]):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(reference, strict=False)
    model.eval()
    outs = []
    with torch.no_grad():
        for ids in prompts_ids:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            outs.append(gen[0, len(ids) :].tolist())
    return outs


# GPTQ runs on two tensor-parallel ranks: act-order row-parallel shards sort their own columns
CASES = [("gptq", ["--num-shard", "2"]), ("awq", []), ("compressed-tensors", []), ("fp8", [])]


@pytest.mark.parametrize(("fmt", "flags"), CASES)
def test_prequantized_checkpoint_is_served_as_transformers_runs_it(
    fmt, flags, tiny_llama_dir, tmp_path
):
    model_dir = tmp_path / fmt
    reference = build_checkpoint(tiny_llama_dir, model_dir, fmt)
    server = ServerProcess(model_dir, *flags, log_path=tmp_path / "server.log")
    try:
        server.wait_healthy(timeout_s=300)
        info = httpx.get(f"{server.url}/info").json()
        assert info["quantize"] == fmt
        client = Client(server.url, timeout=60)
        served = []
        for text in PROMPTS:
            out = client.generate(text, max_new_tokens=NEW_TOKENS)
            served.append([t.id for t in out.details.tokens])
    finally:
        server.stop()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [tokenizer(text).input_ids for text in PROMPTS]
    assert served == transformers_greedy(tiny_llama_dir, reference, prompt_ids)


def launcher(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytgi", "serve", "--hostname", "127.0.0.1",
               "--port", str(free_port()), *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("quantization", "flags", "message"),
    [
        ({"quant_method": "exl2"}, [], "EXL2 checkpoints are not supported by pytgi"),
        ({"quant_method": "gptq", "checkpoint_format": "marlin"}, [], "'marlin' format"),
        ({"quant_method": "compressed-tensors",
          "config_groups": {"g": {"format": "nvfp4-pack-quantized"}}}, [], "nvfp4-pack"),
        ({"quant_method": "awq", "version": "gemm"}, ["--quantize", "gptq"],
         "--quantize gptq does not match"),
        (None, ["--quantize", "awq"], "--quantize awq needs a checkpoint already quantized"),
        ({"quant_method": "gptq"}, ["--dtype", "bfloat16"], "use --dtype float32"),
    ],
)  # fmt: skip
def test_refused_checkpoints_end_the_launcher_in_one_line(
    quantization, flags, message, tiny_llama_dir, tmp_path
):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model_dir)
    if quantization is not None:
        config = json.loads((model_dir / "config.json").read_text())
        config["quantization_config"] = quantization
        (model_dir / "config.json").write_text(json.dumps(config))
    result = launcher("--model-id", str(model_dir), *flags)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "Engine" not in result.stderr  # refused before the engine process started
