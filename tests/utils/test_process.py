"""Child-process helpers: exit codes in words, and a child that ends when its parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pytgi.utils.process import describe_exit_code

CHILD = (
    "import os, time; from pytgi.utils.process import exit_when_orphaned;"
    "exit_when_orphaned(os.getppid()); print(os.getpid(), flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys, time;"
    f"subprocess.Popen([sys.executable, '-c', {CHILD!r}]); time.sleep(60)"
)


def test_exit_codes_in_words():
    assert describe_exit_code(-9) == "exit code -9: SIGKILL"
    assert describe_exit_code(1) == "exit code 1"
    assert describe_exit_code(None) == "still running"


def test_a_child_exits_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no clean-up code runs in the parent
    parent.wait()
    deadline = time.monotonic() + 10
    while running(child):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            raise AssertionError("the orphaned child kept running")
        time.sleep(0.1)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
