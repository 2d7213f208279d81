"""What the launcher says at start-up about flags that take effect silently otherwise: TGI 3's
warning for its batching heuristics that chunked prefill ignores, a half-precision `--dtype` on a
CPU without half-precision matrix instructions, and speculation being on."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

logger = logging.getLogger("pytgi.launcher")

CPUINFO = Path("/proc/cpuinfo")
# the instructions that make a half-precision matmul at least as fast as float32 on a CPU
HALF_MATMUL_FLAGS = {
    "bfloat16": ("amx_bf16", "avx512_bf16"),
    "float16": ("amx_fp16", "avx512_fp16"),
}
# TGI 3's warning (its router, when the model supports chunked prefill)
WAITING_WARNING = (
    "Model supports prefill chunking. `waiting_served_ratio` and `max_waiting_tokens` are not "
    "supported and will be ignored."
)


def cpu_flags(cpuinfo: Path = CPUINFO) -> set[str]:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def warn_waiting_flags(args: argparse.Namespace) -> None:
    """pytgi's scheduler admits waiting requests at every step (chunked prefill or not), so TGI's
    non-chunking heuristics never apply; given ones get TGI's warning."""
    if args.waiting_served_ratio is not None or args.max_waiting_tokens is not None:
        logger.warning("%s", WAITING_WARNING)


def warn_slow_dtype(dtype: str | None, platform: str, flags: set[str] | None = None) -> bool:
    """A bfloat16/float16 `--dtype` on a CPU whose instruction set lacks that type's matrix
    instructions runs its matmuls in emulation, much slower than float32 (the CPU default)."""
    if platform != "cpu" or dtype not in HALF_MATMUL_FLAGS:
        return False
    flags = cpu_flags() if flags is None else flags
    needed = HALF_MATMUL_FLAGS[dtype]
    if flags & set(needed):
        return False
    logger.warning(
        "--dtype %s on a CPU without %s: its matmuls are emulated and run several times slower "
        "than float32, pytgi's default on CPU",
        dtype, " or ".join(needed),
    )  # fmt: skip
    return True


def log_speculation(num_tokens: int | None) -> None:
    if num_tokens:
        logger.info(
            "Speculative decoding on: %d draft tokens per decode step, proposed by n-gram lookup "
            "in each request's own text",
            num_tokens,
        )
