"""Chooses the platform once, at worker start-up, from the device config, and logs the choice:
CUDA when the config asks for it or (`auto`) when torch sees a GPU, else CPU."""

from __future__ import annotations

import logging

import torch

from pytgi.backends.base import Platform
from pytgi.config import DeviceConfig
from pytgi.errors import ConfigError

logger = logging.getLogger(__name__)


def select_platform(config: DeviceConfig | None = None) -> Platform:
    config = config or DeviceConfig()
    if _use_cuda(config.device):
        from pytgi.backends.cuda.platform import CudaPlatform

        platform = CudaPlatform(config)
        name = torch.cuda.get_device_name(platform.index)
        kernels = "Triton kernels" if platform.kernels is not None else "torch ops"
        logger.info(
            "platform: cuda (%s, %s, collectives: %s)", name, kernels, platform.dist_backend
        )
        return platform
    from pytgi.backends.cpu.platform import CpuPlatform

    platform = CpuPlatform(config)
    kernels = "compiled kernels" if platform.kernels is not None else "torch only"
    logger.info("platform: %s (%s, collectives: %s)", platform.name, kernels, platform.dist_backend)
    return platform


def _use_cuda(device: str) -> bool:
    if device == "cpu":
        return False
    available = torch.cuda.is_available()
    if device == "cuda" and not available:
        raise ConfigError("PYTGI_DEVICE=cuda but torch sees no CUDA device")
    return available
