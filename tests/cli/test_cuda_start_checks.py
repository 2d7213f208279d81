"""Start-up refusals on a CUDA engine, decided in the torch-free launcher before any rank starts:
more shards than visible GPUs, and a GGUF model (its kernels are CPU-only)."""

from __future__ import annotations

import pytest

from pytgi.cli import configs
from pytgi.cli.main import launcher_main
from pytgi.errors import ConfigError

# the launcher points the root logger at the captured stderr (tests/cli/conftest.py)
pytestmark = pytest.mark.usefixtures("restore_logging")


def test_more_shards_than_visible_gpus_is_one_line():
    with pytest.raises(ConfigError, match=r"^--num-shard 4 needs 4 GPUs \(one per shard\), but 2"):
        configs.check_visible_gpus(4, "cuda", count=2)
    configs.check_visible_gpus(2, "cuda", count=2)
    configs.check_visible_gpus(4, "cpu", count=0)  # CPU ranks need no GPU


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert configs.visible_gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert configs.visible_gpu_count() == 0


def test_launcher_refuses_shards_without_gpus(tiny_llama_dir, monkeypatch, capsys):
    monkeypatch.setenv("PYTGI_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    argv = ["--model-id", str(tiny_llama_dir), "--num-shard", "2", "--port", "0"]
    assert launcher_main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith("--num-shard 2 needs 2 GPUs (one per shard), but 1 is visible")


def test_launcher_refuses_gguf_on_cuda_with_the_reason(tiny_gguf, monkeypatch, capsys):
    monkeypatch.setenv("PYTGI_DEVICE", "cuda")
    path, _ = tiny_gguf
    assert launcher_main(["--model-id", str(path), "--port", "0"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(
        "GGUF models run on pytgi's CPU kernels only, and the engine would run on cuda "
        "(PYTGI_DEVICE=cpu serves them)"
    )
