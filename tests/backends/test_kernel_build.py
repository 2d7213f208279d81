"""How the CPU kernels are built: a build directory keyed by the sources and flags (so two
checkouts or venvs never load each other's library), a log line before a build starts, and one
build at a time under a file lock (issue 13, item 6)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from types import ModuleType

import filelock
import pytest
import torch.utils.cpp_extension

from pytgi.backends.cpu import kernels


@pytest.fixture
def copied_sources(tmp_path, monkeypatch):
    """The kernel sources copied to a scratch dir (to edit them) and an empty extensions root."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    sources = [Path(shutil.copy(s, csrc)) for s in kernels.SOURCES]
    headers = [Path(shutil.copy(h, csrc)) for h in kernels.HEADERS]
    monkeypatch.setattr(kernels, "SOURCES", sources)
    monkeypatch.setattr(kernels, "HEADERS", headers)
    monkeypatch.setattr(kernels, "default_build_root", lambda root=None: tmp_path / "ext")
    return headers[0]


def test_build_directory_is_keyed_by_sources_and_flags(copied_sources, tmp_path):
    flags = ["-O3", "-fopenmp"]
    first = kernels.build_directory(flags)
    assert first.parent == tmp_path / "ext" and first.name.startswith("pytgi_cpu_ops-")
    assert kernels.build_directory(list(flags)) == first
    assert kernels.build_directory([*flags, "-mavx2"]) != first
    copied_sources.write_text(copied_sources.read_text() + "\n// edited\n")
    assert kernels.build_directory(flags) != first


def test_loaded_kernels_come_from_their_keyed_directory():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    built_in = kernels.build_directory(kernels._cflags())
    assert Path(module.__file__).parent == built_in


def test_builds_are_announced_run_one_at_a_time_and_survive_a_killed_build(
    copied_sources, monkeypatch, caplog
):
    running, overlaps = [], []

    def fake_load(name, build_directory, **kwargs):
        assert not (Path(build_directory) / "lock").exists()  # torch's stale lock was cleared
        lock = Path(build_directory) / "build.lock"
        with pytest.raises(filelock.Timeout):  # the builder holds the lock
            filelock.FileLock(str(lock)).acquire(timeout=0)
        overlaps.append(len(running))
        running.append(name)
        time.sleep(0.2)
        running.remove(name)
        return ModuleType(name)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    stale = kernels.build_directory(kernels._cflags())
    stale.mkdir(parents=True)
    (stale / "lock").touch()  # what a killed build leaves: torch's load would wait on it forever
    caplog.set_level(logging.INFO, logger=kernels.__name__)
    threads = [threading.Thread(target=kernels._build_and_import) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert overlaps == [0, 0]  # the second build waited for the first
    announced = [r.getMessage() for r in caplog.records if "Building the CPU kernels" in r.message]
    assert announced and "may take a few minutes" in announced[0]


def test_every_checkout_compiles_the_same_staged_paths(copied_sources, tmp_path, monkeypatch):
    """Two checkouts of the same sources hand torch the same source paths (copies inside the
    build directory), so its ninja file does not change and nothing rebuilds between them."""
    compiled = []

    def fake_load(name, build_directory, sources, **kwargs):
        compiled.append(sources)
        return ModuleType(name)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    kernels._build_and_import()
    other_checkout = tmp_path / "other"
    other_checkout.mkdir()
    moved = [Path(shutil.copy(s, other_checkout)) for s in kernels.SOURCES + kernels.HEADERS]
    monkeypatch.setattr(kernels, "SOURCES", moved[: len(kernels.SOURCES)])
    monkeypatch.setattr(kernels, "HEADERS", moved[len(kernels.SOURCES) :])
    kernels._build_and_import()
    first, second = compiled
    assert first == second
    staged = kernels.build_directory(kernels._cflags()) / "src"
    assert all(Path(path).parent == staged for path in first)
    assert {p.name for p in staged.iterdir()} == {p.name for p in moved}


def test_the_default_root_named_explicitly_reuses_the_loaded_module():
    """The engine passes DeviceConfig.kernel_build_root (TORCH_EXTENSIONS_DIR's value), a test
    often passes nothing: both must reach one import (a second registers the types again)."""
    from torch.utils.cpp_extension import get_default_build_root

    assert kernels.load_cpu_kernels(get_default_build_root()) is kernels.load_cpu_kernels()
