"""RankSupervisor: spawns tensor-parallel ranks 1..N-1 from the engine process and watches them.

A daemon thread waits on the ranks' process sentinels, so a rank that dies is noticed at once,
whether a step is running or the engine is idle. The first death is recorded with the rank's own
error when it reported one (ranks report ("started" | "failed", rank, message) on a queue), then
`on_death(message)` is called once from that thread, so the engine can tell the launcher even while
its main thread is blocked in a collective, and `check()` raises it as an EngineDeadError.
`end_ranks` leaves no rank behind: what does not exit within the grace period is killed.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from pathlib import Path

import torch.multiprocessing as mp

from pytgi.config import EngineConfig
from pytgi.errors import EngineDeadError
from pytgi.utils.process import describe_exit_code
from pytgi.worker.worker import run_worker

logger = logging.getLogger(__name__)

REPORT_WAIT_S = 0.2  # a rank puts its failure report before it exits; let it arrive
KILL_WAIT_S = 5.0


class RankSupervisor:
    def __init__(self, config: EngineConfig, on_death: Callable[[str], None] | None = None):
        self.config = config
        self.procs: dict[int, mp.Process] = {}  # rank -> process
        self.death: str | None = None  # the first rank death, in words
        self._on_death = on_death
        self._died = threading.Event()
        self._stopping = threading.Event()
        self._wake_reader, self._wake_writer = mp.Pipe(duplex=False)
        self._reports = None
        self._reports_lock = threading.Lock()
        self._started: set[int] = set()
        self._failures: dict[int, str] = {}
        self._monitor: threading.Thread | None = None

    def start(self, model_dir: Path, target: Callable = run_worker) -> None:
        """Spawn ranks 1..N-1 as `target(config, rank, model_dir, reports, parent_pid)` (tests pass
        their own) and start watching them."""
        ctx = mp.get_context("spawn")
        self._reports = ctx.Queue()
        for rank in range(1, self.config.parallel.num_shard):
            proc = ctx.Process(
                target=target,
                args=(self.config, rank, model_dir, self._reports, os.getpid()),
                name=f"pytgi-tp-rank-{rank}",
                daemon=True,
            )
            proc.start()
            self.procs[rank] = proc
        self._monitor = threading.Thread(target=self._watch, name="pytgi-rank-monitor", daemon=True)
        self._monitor.start()

    def wait_started(self, timeout_s: float) -> None:
        """Wait until every rank is about to join the process group, so that a rank that fails to
        start is reported at once rather than after the rendezvous times out."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._drain_reports(timeout_s=0.5)
            self.check()
            pending = sorted(set(self.procs) - self._started)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise EngineDeadError(
                    f"tensor-parallel ranks {pending} did not start within {timeout_s:.0f}s"
                )

    def check(self, wait_s: float = 0.0) -> None:
        """Raise EngineDeadError if a rank died, waiting up to `wait_s` for one to (a crashed peer
        usually shows up first as a failed collective on this rank)."""
        if self._died.wait(wait_s):
            raise EngineDeadError(self.death)

    def stop_monitoring(self) -> None:
        """From now on ranks are expected to exit (shutdown): their exits are no longer deaths."""
        self._stopping.set()
        self._wake_writer.send(None)
        if self._monitor is not None:
            self._monitor.join()
            self._monitor = None

    def end_ranks(self, grace_s: float) -> None:
        """Wait up to `grace_s` for the ranks to exit, then kill the rest (SIGKILL also ends a
        stopped rank or one stuck in a collective). Call `stop_monitoring` first."""
        deadline = time.monotonic() + grace_s
        for rank, proc in self.procs.items():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                if grace_s > 0:
                    logger.warning("tensor-parallel rank %d did not exit; killing it", rank)
                proc.kill()
        for proc in self.procs.values():
            proc.join(KILL_WAIT_S)
        self.procs = {}
        if self._reports is not None:
            self._reports.close()
            self._reports = None

    # ---- the monitor thread -------------------------------------------------------------------

    def _watch(self) -> None:
        by_sentinel = {proc.sentinel: rank for rank, proc in self.procs.items()}
        ready = connection.wait([*by_sentinel, self._wake_reader])
        exited = sorted(by_sentinel[s] for s in ready if s in by_sentinel)
        if exited and not self._stopping.is_set():
            self._record_death(exited[0])

    def _record_death(self, rank: int) -> None:
        proc = self.procs[rank]
        proc.join(KILL_WAIT_S)  # its sentinel fired: this only reaps it
        self._drain_reports(timeout_s=REPORT_WAIT_S)
        code = describe_exit_code(proc.exitcode)
        reason = self._failures.get(rank)
        if reason:
            self.death = f"tensor-parallel rank {rank} failed ({code}): {reason}"
        else:
            self.death = f"tensor-parallel rank {rank} died ({code})"
        if self._on_death is not None:  # before check() can raise it: the launcher hears first
            self._on_death(self.death)
        self._died.set()

    def _drain_reports(self, timeout_s: float) -> None:
        """Read the ranks' reports, waiting up to `timeout_s` for the first one."""
        with self._reports_lock:
            try:
                kind, rank, message = self._reports.get(timeout=timeout_s)
                while True:
                    if kind == "started":
                        self._started.add(rank)
                    elif kind == "failed":
                        self._failures[rank] = message
                    kind, rank, message = self._reports.get_nowait()
            except queue.Empty:
                return
