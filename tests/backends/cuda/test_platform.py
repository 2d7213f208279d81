"""The CUDA platform's decisions that need no GPU: TGI's default dtype per model family, the
runner resolving it from the checkpoint, and the memory left within --cuda-memory-fraction."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from backends.cuda.interpreted import InterpretedCudaPlatform

from pytgi.backends.cuda.attention import TritonAttentionBackend
from pytgi.backends.cuda.platform import CudaPlatform, default_cuda_dtype
from pytgi.config import DeviceConfig, EngineConfig, ModelConfig
from pytgi.worker.model_runner import ModelRunner


def test_default_dtype_follows_tgi():
    assert default_cuda_dtype("llama") == torch.float16
    assert default_cuda_dtype("qwen2") == torch.float16
    assert default_cuda_dtype("gemma2") == torch.bfloat16
    assert default_cuda_dtype(None) == torch.float16


def test_runner_takes_the_platform_default_for_the_checkpoint(tiny_llama_dir):
    config = EngineConfig(model=ModelConfig(model_id=str(tiny_llama_dir)))
    runner = ModelRunner(config, InterpretedCudaPlatform())
    runner.load_model(tiny_llama_dir)
    assert runner.dtype == torch.float16
    assert isinstance(runner.attention, TritonAttentionBackend)
    assert next(runner.model.parameters()).dtype == torch.float16
    assert runner.accelerator is None  # no graph sizes: eager


def test_available_memory_leaves_what_the_fraction_keeps_away(monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (50 * gib, 100 * gib))
    platform = InterpretedCudaPlatform(config=DeviceConfig(cuda_memory_fraction=0.8))
    assert CudaPlatform.available_memory_bytes(platform) == 30 * gib
    platform = InterpretedCudaPlatform(config=DeviceConfig(cuda_memory_fraction=0.4))
    assert CudaPlatform.available_memory_bytes(platform) == 0


def test_the_platform_is_frozen():
    """Its kernels and config are chosen once, when it is built."""
    platform = InterpretedCudaPlatform()
    with pytest.raises(dataclasses.FrozenInstanceError):
        platform.kernels = None
