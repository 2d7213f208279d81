"""The engine process ends when the launcher dies while the model is still loading (not only once
its step loop runs): a launcher killed by SIGKILL must not leave an engine behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# a launcher stand-in: starts the engine on a model whose config.json is a FIFO nobody writes, so
# the engine blocks in its load for as long as the test wants
LAUNCHER = """
import sys
from pytgi.config import EngineConfig, ModelConfig
from pytgi.engine.multiproc_client import MultiprocEngineClient
from pytgi.runtime.build import build_engine_core
config = EngineConfig(model=ModelConfig(model_id=sys.argv[1]))
MultiprocEngineClient.start(config, build_engine_core)
"""


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_engine_exits_when_the_launcher_dies_during_the_load(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    os.mkfifo(model_dir / "config.json")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(model_dir)])
    deadline = time.monotonic() + 60
    while not (engines := children(launcher.pid)):
        assert launcher.poll() is None and time.monotonic() < deadline, "no engine started"
        time.sleep(0.1)
    time.sleep(1.0)  # the engine is now importing or blocked reading the FIFO
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    (engine,) = engines
    deadline = time.monotonic() + 30
    while running(engine):
        if time.monotonic() > deadline:
            os.kill(engine, signal.SIGKILL)
            raise AssertionError("the engine outlived its launcher")
        time.sleep(0.1)
