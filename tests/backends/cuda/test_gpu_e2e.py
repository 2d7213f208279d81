"""End to end on the GPU: `pytgi generate` (CLI, memory-sized KV cache) gives the same greedy text
with CUDA graphs and without; `pytgi serve` answers over HTTP and reports the CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
from backends.cuda.gpu import requires_gpu
from backends.cuda.test_gpu_graphs import small_memory_fraction
from e2e.server import ServerProcess

pytestmark = requires_gpu


def generate(model_dir, graphs: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_GRAPHS": graphs, "CUDA_MEMORY_FRACTION": small_memory_fraction()}
    return subprocess.run(
        [sys.executable, "-m", "pytgi", "generate", "And God said", "--model-id", str(model_dir),
         "--max-new-tokens", "32", "--ignore-eos", "--dtype", "float32"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_generate_cli_same_text_with_and_without_graphs(demo_model_dir):
    with_graphs, eager = generate(demo_model_dir, "1,2,4,8"), generate(demo_model_dir, "0")
    assert with_graphs.returncode == 0, with_graphs.stderr
    assert eager.returncode == 0, eager.stderr
    assert with_graphs.stdout == eager.stdout
    assert len(with_graphs.stdout.split()) > 5


def test_serve_on_the_gpu(demo_model_dir, tmp_path):
    server = ServerProcess(demo_model_dir, "--cuda-graphs", "1,2,4", log_path=tmp_path / "log")
    try:
        server.wait_healthy(timeout_s=300)
        info = httpx.get(f"{server.url}/info", timeout=10).json()
        assert info["kv_cache"]["device"] == "cuda"
        assert info["kv_cache"]["dtype"] == "float16"  # TGI's GPU default for a Llama
        body = {"inputs": "And God said", "parameters": {"max_new_tokens": 24}}
        first = httpx.post(f"{server.url}/generate", json=body, timeout=60)
        assert first.status_code == 200, first.text
        assert first.headers["x-compute-type"] == "1-cuda"
        again = httpx.post(f"{server.url}/generate", json=body, timeout=60).json()
        assert again["generated_text"] == first.json()["generated_text"]
        assert "cuda-graphs: captured" in server.logs()
    finally:
        server.stop()
