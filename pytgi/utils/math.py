"""Small integer helpers shared by the engine (block counts) and the workers (tensor layouts)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for non-negative integers."""
    return -(-a // b)
