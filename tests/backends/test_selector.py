"""The platform is chosen once from the device config: CPU when asked or without a GPU, CUDA
when asked (an error without a GPU) or, on `auto`, when torch sees one."""

from __future__ import annotations

import pytest
import torch

from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.backends.selector import select_platform
from pytgi.config import DeviceConfig
from pytgi.errors import ConfigError

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")


def test_cpu_when_asked():
    assert isinstance(select_platform(DeviceConfig(device="cpu", kernels=False)), CpuPlatform)


@no_gpu
def test_auto_without_a_gpu_is_cpu():
    assert isinstance(select_platform(DeviceConfig(kernels=False)), CpuPlatform)


@no_gpu
def test_cuda_without_a_gpu_is_an_error():
    with pytest.raises(ConfigError, match="no CUDA device"):
        select_platform(DeviceConfig(device="cuda"))


@pytest.mark.parametrize("model_type", ["llama", "gemma2", None])
def test_cpu_models_default_to_float32(model_type):
    """A deviation from TGI's GPU defaults (docs/TGI_COMPATIBILITY.md §17): reduced-precision
    matmuls are slower than fp32 on CPUs without bf16 instructions."""
    assert CpuPlatform(DeviceConfig(kernels=False)).default_dtype(model_type) == torch.float32
