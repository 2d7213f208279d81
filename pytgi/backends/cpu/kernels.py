"""pytgi's compiled CPU kernels (csrc/), built on first use with torch's C++ extension loader.

The build lives in `pytgi_cpu_ops-<key>` under `DeviceConfig.kernel_build_root`
(TORCH_EXTENSIONS_DIR; default ~/.cache/torch_extensions/pyXY_cpu), where the key hashes the
sources, the header, the compiler flags, torch's version and Python's ABI: checkouts and venvs
with the same sources share one build, and one with other sources never loads it. A file lock
makes concurrent first starts build once (the others wait, then load).

`load_cpu_kernels()` builds and imports them once per process (later calls return the same
module); `CpuPlatform` calls it when the device config allows kernels, and resolves the quantized
kernel table it then names in every call (`resolve_quant_isa`). A build takes one to two minutes
on two cores, announced in the log before it starts. The platform hands the module to the layers
when they are built (`Platform.kernels_for`); a failed build (no compiler) leaves the pure-torch
path in charge everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch
from filelock import FileLock

from pytgi.errors import ConfigError

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [
    CSRC / "ops.cpp",
    CSRC / "decode_stack.cpp",
    CSRC / "quant_ops.cpp",
    CSRC / "quant_scalar.cpp",
    CSRC / "quant_avx2_i8.cpp",
    CSRC / "quant_avx2_f32.cpp",
    CSRC / "quant_vnni_i8.cpp",
    CSRC / "quant_vnni512.cpp",
    CSRC / "kquant_ops.cpp",
    CSRC / "kquant_scalar.cpp",
    CSRC / "kquant_avx2.cpp",
    CSRC / "kquant_vnni512.cpp",
]
HEADERS = [
    CSRC / "attention.h",
    CSRC / "common.h",
    CSRC / "quant.h",
    CSRC / "quant_ops.h",
    CSRC / "quant_avx2.h",
    CSRC / "quant_i8_passes.h",
    CSRC / "moe_stack.h",
    CSRC / "kquant.h",
    CSRC / "kquant_passes.h",
]
MODULE_NAME = "pytgi_cpu_ops"
# how a build directory's sources are laid out (copied into it, `_staged_sources`): part of its
# key, so that no build ever compiled from another layout's paths is reused, or rebuilt
STAGING = b"staged-sources-1"


def _cflags() -> list[str]:
    flags = ["-O3", "-fopenmp"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        # the wheel's own dispatch picked AVX2 + FMA for this CPU; every such CPU has F16C
        flags += ["-mavx2", "-mfma", "-mf16c"]
    return flags


def default_build_root(root: str | None = None) -> Path:
    """Where builds live: `root` (TORCH_EXTENSIONS_DIR's value), else torch's default root (which
    reads the same variable, else ~/.cache/torch_extensions), then `pyXY_cpu`: one place for a
    given root whichever way it arrives."""
    from torch.utils.cpp_extension import get_default_build_root

    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root or get_default_build_root()) / f"{python}_cpu"


def build_directory(cflags: list[str], root: str | None = None) -> Path:
    """Where this exact build lives under `root` (`DeviceConfig.kernel_build_root`, default
    torch's): keyed by sources, header, flags, torch and Python ABI."""
    digest = hashlib.sha256()
    for path in SOURCES + HEADERS:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    abi = f"{sys.implementation.cache_tag}{getattr(sys, 'abiflags', '')}"
    digest.update("\0".join([*cflags, torch.__version__, abi]).encode())
    digest.update(STAGING)
    base = default_build_root(root)
    return base / f"{MODULE_NAME}-{digest.hexdigest()[:16]}"


def _build_and_import(root: str | None = None) -> ModuleType:
    from torch.utils.cpp_extension import load

    cflags = _cflags()
    directory = build_directory(cflags, root)
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(str(directory / "build.lock")):  # one build at a time; the others then load it
        # torch's own lock file, left behind by a build that was killed, would make every later
        # `load` wait forever; under our lock (released by the OS when a builder dies) no other
        # build of this directory runs, so a leftover one is stale
        (directory / "lock").unlink(missing_ok=True)
        if not (directory / f"{MODULE_NAME}.so").exists():
            logger.info(
                "Building the CPU kernels in %s (once per source version; this may take a few "
                "minutes)",
                directory,
            )
        return load(
            name=MODULE_NAME,
            sources=_staged_sources(directory),
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )


def _staged_sources(directory: Path) -> list[str]:
    """The sources and headers, copied once into the build directory (its key already says their
    content is these files'): torch's ninja file names the sources' paths, and another checkout's
    paths would make it rebuild everything on each switch between checkouts."""
    staged = directory / "src"
    staged.mkdir(exist_ok=True)
    for path in SOURCES + HEADERS:
        target = staged / path.name
        if not target.exists():
            partial = target.with_suffix(target.suffix + ".part")
            shutil.copy2(path, partial)
            os.replace(partial, target)  # a killed copy never leaves a half file behind
    return [str(staged / path.name) for path in SOURCES]


def load_cpu_kernels(build_root: str | None = None) -> ModuleType | None:
    """Build (or reuse) and import the kernels, once per process; None when the build fails.
    The cache key is the resolved root, so that `None` and the same root named explicitly never
    import the module twice (a second import would register its types again)."""
    from torch.utils.cpp_extension import get_default_build_root

    return _load_once(build_root or get_default_build_root())


@functools.cache  # one import per process: a second would register the kernels' types again
def _load_once(build_root: str | None) -> ModuleType | None:
    start = time.perf_counter()
    try:
        module = _build_and_import(build_root)
    except Exception as exc:  # no compiler or headers: the torch path still works
        logger.warning("CPU kernels unavailable, using the pure-torch path: %s", exc)
        return None
    logger.info("CPU kernels ready (%.1f s)", time.perf_counter() - start)
    return module


def resolve_quant_isa(module: ModuleType, requested: str) -> str:
    """The quantized-kernel table `requested` (DeviceConfig.quant_isa, PYTGI_QUANT_ISA) names:
    "auto" is the best this build and CPU have; a table they lack is a start-up error."""
    available = module.quant_isas()  # best first
    if requested == "auto":
        return available[0]
    if requested not in available:
        raise ConfigError(
            f"PYTGI_QUANT_ISA={requested}: the {requested} quant kernels are not available on this "
            f"build/CPU (available: auto, {', '.join(available)})"
        )
    return requested
