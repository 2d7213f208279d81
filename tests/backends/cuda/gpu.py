"""Helpers of the `gpu` tests: a ModelRunner on the CUDA platform, transformers on the GPU, and
where the measured numbers go (PYTGI_GPU_RESULTS, a directory the validation script collects)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from pytgi.config import DeviceConfig, EngineConfig, ModelConfig
from pytgi.worker.model_runner import ModelRunner

requires_gpu = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def cuda_runner(
    model_dir: Path, dtype: str, cuda_graphs: tuple[int, ...], num_blocks: int = 256
) -> ModelRunner:
    """A runner on the GPU with its KV caches allocated and (when asked) graphs captured."""
    from pytgi.backends.cuda.platform import CudaPlatform

    config = EngineConfig(model=ModelConfig(model_id=str(model_dir), dtype=dtype))
    runner = ModelRunner(config, CudaPlatform(DeviceConfig(cuda_graphs=cuda_graphs)))
    runner.load_model(model_dir)
    runner.allocate_kv_cache(num_blocks)
    runner.capture_decode_steps()
    return runner


def load_hf_cuda(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=dtype
    )
    model.generation_config.eos_token_id = None
    return model.to(device="cuda", dtype=dtype).eval()  # dtype again: older transformers ignore it


def record(name: str, values: dict) -> None:
    """Keep a test's measurements as JSON for the validation report (no-op without the env)."""
    directory = os.environ.get("PYTGI_GPU_RESULTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.json").write_text(json.dumps(values, indent=2))
