"""Helpers for the server's child processes: exit codes in words, exiting with the parent, and
leaving Ctrl-C to the launcher."""

from __future__ import annotations

import os
import signal
import threading
import time

ORPHAN_POLL_S = 0.5


def describe_exit_code(code: int | None) -> str:
    """`-9` -> "exit code -9: SIGKILL" (multiprocessing reports a signal as minus its number)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"exit code {code}: {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def exit_when_orphaned(parent_pid: int, exit_code: int = 1) -> threading.Thread:
    """Start a daemon thread that ends this process at once when `parent_pid` is no longer its
    parent (the parent died, even by SIGKILL, so nobody would clean this process up). It works
    while the main thread is blocked in C code that released the GIL (a collective, a load)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(ORPHAN_POLL_S)
        os._exit(exit_code)

    thread = threading.Thread(target=watch, name="pytgi-orphan-watch", daemon=True)
    thread.start()
    return thread


def ignore_terminal_interrupts() -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole process group, children included; only the
    launcher may act on it (it drains in-flight requests, then stops the engine, which stops its
    ranks). A child that died of it first would fail the very requests being drained."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
