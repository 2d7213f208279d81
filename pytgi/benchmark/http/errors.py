"""Typed errors of the HTTP benchmark. Request-level failures are data (`RequestResult.error`),
not exceptions; these are for a run that cannot start."""

from __future__ import annotations

from pytgi.errors import ConfigError


class BenchConfigError(ConfigError):
    """Bad flags, an unreadable prompts file or a tokenizer that cannot be loaded."""
