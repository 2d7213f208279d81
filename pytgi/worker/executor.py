"""Executors: what the engine calls to run steps (`initialize`, `execute`, `shutdown`).

`UniprocExecutor` runs the single rank in the engine process. `MultiprocExecutor` runs rank 0 there
too and spawns ranks 1..N-1; rank 0 sends each step's inputs to the others (`step_transport`),
every rank runs its shard, and only rank 0 samples. A rank that died turns the next step into an
EngineDeadError.
"""

from __future__ import annotations

import logging
import queue
import time

import torch.multiprocessing as mp

from pytgi.config import CacheInfo, EngineConfig
from pytgi.distributed.parallel_state import destroy_distributed
from pytgi.engine.executor import Executor
from pytgi.engine.outputs import ModelOutput, SchedulerOutput
from pytgi.errors import EngineDeadError
from pytgi.worker.step_transport import send_step
from pytgi.worker.worker import Worker, run_worker

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
START_TIMEOUT_S = 300.0  # spawned ranks import torch and pytgi before they report in


def _model_dir(config: EngineConfig):
    from pytgi.utils.hub import resolve_model_dir

    return resolve_model_dir(config.model)


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.worker: Worker | None = None

    def initialize(self) -> CacheInfo:
        self.worker = Worker(self.config, rank=0)
        return self.worker.initialize(_model_dir(self.config))

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        return self.worker.execute(scheduler_output)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.worker: Worker | None = None
        self.procs: list = []
        self.reports = None  # queue of ("started" | "failed", rank, message) from spawned ranks
        self.failures: dict[int, str] = {}
        self.ready = False  # every rank initialised and following rank 0's broadcasts

    def initialize(self) -> CacheInfo:
        model_dir = _model_dir(self.config)
        ctx = mp.get_context("spawn")
        self.reports = ctx.Queue()
        for rank in range(1, self.config.parallel.num_shard):
            proc = ctx.Process(
                target=run_worker,
                args=(self.config, rank, model_dir, self.reports),
                name=f"pytgi-tp-rank-{rank}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        try:
            self._wait_started()
            self.worker = Worker(self.config, rank=0)
            cache_info = self.worker.initialize(model_dir)
        except Exception as e:
            try:
                if isinstance(e, RuntimeError):  # a collective failed: was it a dead rank?
                    self._check_ranks(wait_s=2.0, cause=e)
                raise
            finally:
                self.shutdown()
        self.ready = True
        return cache_info

    def _wait_started(self) -> None:
        """Wait until every spawned rank is about to join the group, so that a rank that fails to
        start is reported at once rather than after the process-group timeout."""
        pending = set(range(1, self.config.parallel.num_shard))
        deadline = time.monotonic() + START_TIMEOUT_S
        while pending:
            try:
                kind, rank, message = self.reports.get(timeout=0.5)
            except queue.Empty:
                self._check_ranks()
                if time.monotonic() > deadline:
                    raise EngineDeadError(
                        f"tensor-parallel ranks {sorted(pending)} did not start within "
                        f"{START_TIMEOUT_S:.0f}s"
                    ) from None
                continue
            pending.discard(rank)
            if kind == "failed":
                self.failures[rank] = message

    def _check_ranks(self, wait_s: float = 0.0, cause: BaseException | None = None) -> None:
        """Raise EngineDeadError (with the rank's own error when it reported one) if a rank died."""
        deadline = time.monotonic() + wait_s
        for rank, proc in enumerate(self.procs, start=1):
            proc.join(max(0.0, deadline - time.monotonic()))  # 0: just poll
            if proc.is_alive():
                continue
            self._drain_reports()
            reason = self.failures.get(rank, "see its log above")
            raise EngineDeadError(
                f"tensor-parallel rank {rank} died (exit code {proc.exitcode}): {reason}. "
                "The server cannot continue with a missing shard."
            ) from cause

    def _drain_reports(self) -> None:
        while True:
            try:
                kind, rank, message = self.reports.get_nowait()
            except queue.Empty:
                return
            if kind == "failed":
                self.failures[rank] = message

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        self._check_ranks()
        try:
            return self.worker.execute(scheduler_output)
        except RuntimeError as e:
            self._check_ranks(wait_s=2.0, cause=e)
            raise

    def shutdown(self) -> None:
        if self.ready and all(p.is_alive() for p in self.procs):
            send_step(None)  # the ranks leave their step loop
        for proc in self.procs:
            proc.join(SHUTDOWN_TIMEOUT_S if self.ready else 0.0)
            if proc.is_alive():
                logger.warning("rank process %s did not exit; terminating it", proc.name)
                proc.terminate()
                proc.join(SHUTDOWN_TIMEOUT_S)
        self.procs = []
        self.ready = False
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
        destroy_distributed()


def create_executor(config: EngineConfig) -> Executor:
    if config.parallel.num_shard == 1:
        return UniprocExecutor(config)
    return MultiprocExecutor(config)
