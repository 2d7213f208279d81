"""Chooses the platform once, at worker start-up, from the device config, and logs the choice."""

from __future__ import annotations

import logging

from pytgi.backends.base import Platform
from pytgi.config import DeviceConfig

logger = logging.getLogger(__name__)


def select_platform(config: DeviceConfig | None = None) -> Platform:
    from pytgi.backends.cpu.platform import CpuPlatform

    platform = CpuPlatform(config)
    kernels = "compiled kernels" if platform.kernels is not None else "torch only"
    logger.info("platform: %s (%s, collectives: %s)", platform.name, kernels, platform.dist_backend)
    return platform
