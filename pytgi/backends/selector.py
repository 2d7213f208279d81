"""Chooses the platform and attention backend once, at ModelRunner start-up, and logs the choice."""

from __future__ import annotations

import logging

from pytgi.backends.base import AttentionBackend, Platform

logger = logging.getLogger(__name__)


def select_platform() -> Platform:
    from pytgi.backends.cpu.platform import CpuPlatform

    platform = CpuPlatform()
    logger.info("platform: %s (collectives: %s)", platform.name, platform.dist_backend)
    return platform


def select_attention_backend(platform: Platform) -> AttentionBackend:
    assert platform.name == "cpu", f"no attention backend for platform {platform.name}"
    from pytgi.backends.cpu.attention import CpuAttentionBackend
    from pytgi.backends.cpu.kernels import load_cpu_kernels

    backend = CpuAttentionBackend()
    kernels = "compiled kernels" if load_cpu_kernels() is not None else "torch only"
    logger.info("attention backend: %s (%s)", backend.name, kernels)
    return backend
