"""pytgi's compiled CPU kernels (csrc/), built on first use with torch's C++ extension loader and
cached by it (~/.cache/torch_extensions, keyed by the source's hash).

`load_cpu_kernels()` is called once per process by `CpuPlatform` when the device config allows
kernels; it compiles if needed (~30 s the first time on a machine) and logs the outcome. The
platform hands the module to the layers when they are built (`Platform.kernels_for`); a failed
build (no compiler) leaves the pure-torch path in charge everywhere.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from types import ModuleType

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "ops.cpp", CSRC / "decode_stack.cpp"]
HEADERS = [CSRC / "common.h"]
_state: dict[str, ModuleType | None] = {}


def _cflags() -> list[str]:
    # the loader rebuilds when the sources or the flags change; the header's hash in the flags
    # makes a header edit rebuild too
    digest = hashlib.sha256(b"".join(h.read_bytes() for h in HEADERS)).hexdigest()[:16]
    flags = ["-O3", "-fopenmp", f"-DPYTGI_HEADERS_SHA={digest}"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]  # the wheel's own dispatch picked these for this CPU
    return flags


def load_cpu_kernels() -> ModuleType | None:
    """Build (or reuse) and import the kernels, once per process; None when the build fails."""
    if "module" in _state:
        return _state["module"]
    module = None
    start = time.perf_counter()
    try:
        from torch.utils.cpp_extension import load

        module = load(
            name="pytgi_cpu_ops",
            sources=[str(s) for s in SOURCES],
            extra_cflags=_cflags(),
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
        logger.info("CPU kernels ready (%.1f s)", time.perf_counter() - start)
    except Exception as exc:  # no compiler or headers: the torch path still works
        logger.warning("CPU kernels unavailable, using the pure-torch path: %s", exc)
    _state["module"] = module
    return module
