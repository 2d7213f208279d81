"""Executors: what the engine calls to run steps (`initialize`, `execute`, `shutdown`).

`UniprocExecutor` runs the single rank in the engine process. `MultiprocExecutor` runs rank 0 there
too and spawns ranks 1..N-1; each step's SchedulerOutput is broadcast from rank 0, every rank runs
its shard, and only rank 0 samples. A rank that died turns the next step into an EngineDeadError.
"""

from __future__ import annotations

import logging
import queue
import time
from abc import ABC, abstractmethod

import torch.multiprocessing as mp

from pytgi.config import CacheInfo, EngineConfig
from pytgi.distributed.comm import tp_broadcast_object
from pytgi.engine.outputs import ModelOutput, SchedulerOutput
from pytgi.errors import EngineDeadError
from pytgi.worker.worker import Worker, run_worker

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
START_TIMEOUT_S = 300.0  # spawned ranks import torch and pytgi before they report in


class Executor(ABC):
    @abstractmethod
    def initialize(self) -> CacheInfo:
        """Load the model on every rank, warm up, size and allocate the KV cache."""

    @abstractmethod
    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step; returns the sampled tokens (and prefill logprobs) keyed by request id."""

    @abstractmethod
    def shutdown(self) -> None: ...


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

    def initialize(self) -> CacheInfo:
        model_dir = _model_dir(self.config)
        ctx = mp.get_context("spawn")
        started = ctx.Queue()
        for rank in range(1, self.config.parallel.num_shard):
            proc = ctx.Process(
                target=run_worker,
                args=(self.config, rank, model_dir, started),
                name=f"pytgi-tp-rank-{rank}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)
        self._wait_started(started)
        try:
            self.worker = Worker(self.config, rank=0)
            return self.worker.initialize(model_dir)
        except RuntimeError:
            self._raise_if_rank_died(wait_s=2.0)
            raise

    def _wait_started(self, started) -> None:
        """Wait until every spawned rank is about to join the group, so that a rank that fails to
        start is reported at once rather than after the process-group timeout."""
        pending = set(range(1, self.config.parallel.num_shard))
        deadline = time.monotonic() + START_TIMEOUT_S
        while pending:
            try:
                pending.discard(started.get(timeout=0.5))
            except queue.Empty:
                self._raise_if_rank_died()
                if time.monotonic() > deadline:
                    raise EngineDeadError(
                        f"tensor-parallel ranks {sorted(pending)} did not start within "
                        f"{START_TIMEOUT_S:.0f}s"
                    ) from None

    def _raise_if_rank_died(self, wait_s: float = 0.0) -> None:
        deadline = time.monotonic() + wait_s
        for rank, proc in enumerate(self.procs, start=1):
            proc.join(max(0.0, deadline - time.monotonic()))  # 0: just poll
            if not proc.is_alive():
                raise EngineDeadError(
                    f"tensor-parallel rank {rank} died (exit code {proc.exitcode}); "
                    "see its log above. The server cannot continue with a missing shard."
                )

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        self._raise_if_rank_died()
        try:
            tp_broadcast_object(scheduler_output)
            return self.worker.execute(scheduler_output)
        except RuntimeError:
            self._raise_if_rank_died(wait_s=2.0)
            raise

    def shutdown(self) -> None:
        if self.worker is not None and all(p.is_alive() for p in self.procs):
            tp_broadcast_object(None)
        for proc in self.procs:
            proc.join(SHUTDOWN_TIMEOUT_S)
            if proc.is_alive():
                logger.warning("rank process %s did not exit; terminating it", proc.name)
                proc.terminate()
        self.procs = []
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None


def create_executor(config: EngineConfig) -> Executor:
    if config.parallel.num_shard == 1:
        return UniprocExecutor(config)
    return MultiprocExecutor(config)
