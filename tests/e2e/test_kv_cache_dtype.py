"""`pytgi serve --kv-cache-dtype fp8_e4m3fn` and `int8`: `/info` names the cache's dtype and its
bytes per token (a quarter of the fp32 cache's for fp8; int8's per-row scales counted), the served
greedy tokens are the offline engine's with the same cache; a value pytgi cannot run there is
refused before any engine starts, in one line."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from text_generation import Client

from e2e.server import ServerProcess, free_port
from pytgi.runtime.llm import LLM

PROMPTS = ["Hello world", "The quick brown fox"]
NEW_TOKENS = 12


# tiny Llama: 2 layers x (K, V) x 2 KV heads x head_dim 16, one byte each (int8: and 4 scale bytes)
@pytest.mark.parametrize(
    "kv_cache_dtype, dtype, bytes_per_token",
    [("fp8_e4m3fn", "float8_e4m3fn", 2 * 2 * 2 * 16), ("int8", "int8", 2 * 2 * 2 * (16 + 4))],
)
def test_a_narrow_cache_is_served_and_reported(
    kv_cache_dtype, dtype, bytes_per_token, tiny_llama_dir, tmp_path
):
    llm = LLM(str(tiny_llama_dir), num_blocks=64, kv_cache_dtype=kv_cache_dtype)
    try:
        offline = [o.token_ids for o in llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)]
    finally:
        llm.close()
    server = ServerProcess(
        tiny_llama_dir, "--kv-cache-dtype", kv_cache_dtype, log_path=tmp_path / "server.log"
    )
    try:
        server.wait_healthy(timeout_s=300)
        info = httpx.get(f"{server.url}/info").json()
        kv = info["kv_cache"]
        assert (kv["dtype"], kv["model_dtype"]) == (dtype, "float32")
        assert kv["bytes_per_token"] == bytes_per_token
        assert info["max_batch_total_tokens"] == kv["num_blocks"] * kv["block_size"]
        client = Client(server.url, timeout=60)
        served = [
            [t.id for t in client.generate(p, max_new_tokens=NEW_TOKENS).details.tokens]
            for p in PROMPTS
        ]
        assert served == offline
        assert dtype in server.logs()  # the memory plan's log line names the format
    finally:
        server.stop()


def test_an_fp8_cache_on_cuda_is_refused_in_one_line(tiny_llama_dir):
    command = [sys.executable, "-m", "pytgi", "serve", "--model-id", str(tiny_llama_dir),
               "--port", str(free_port()), "--kv-cache-dtype", "fp8_e5m2"]  # fmt: skip
    env = {"PYTGI_DEVICE": "cuda", "HF_HUB_OFFLINE": "1", "PATH": ""}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "--kv-cache-dtype fp8_e5m2 is not supported on cuda" in errors[0]
    assert "Traceback" not in result.stderr
