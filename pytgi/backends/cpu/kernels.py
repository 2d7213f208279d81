"""pytgi's compiled CPU kernels (csrc/ops.cpp), built on first use with torch's C++ extension
loader and cached by it (~/.cache/torch_extensions, keyed by the source's hash).

`load_cpu_kernels()` is called once at start-up (`select_attention_backend` on CPU); it compiles
if needed (~30 s the first time on a machine) and logs the outcome. Layers then ask
`cpu_kernels_for(tensor)`, which never compiles: it returns the module for float32 CPU tensors
once loaded, else None, and the caller runs its pure-torch path. A failed build (no compiler) or
PYTGI_CPU_KERNELS=0 leaves the torch path in charge everywhere.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from types import ModuleType

import torch

from pytgi import envs

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
    """Build (or reuse) and import the kernels; None when disabled or the build fails."""
    if "module" in _state:
        return _state["module"]
    module = None
    if not envs.cpu_kernels_enabled():
        logger.info("CPU kernels disabled (PYTGI_CPU_KERNELS=0): pure-torch path")
    else:
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


def cpu_kernels_for(x: torch.Tensor) -> ModuleType | None:
    """The loaded kernels if they apply to `x` (float32 on CPU), else None. Never compiles."""
    module = _state.get("module")
    if module is None or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    return module
