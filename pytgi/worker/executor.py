"""Executors: what the engine calls to run steps (`initialize`, `execute`, `shutdown`).

`UniprocExecutor` runs the single rank in the engine process. `MultiprocExecutor` runs rank 0 there
too and spawns ranks 1..N-1; rank 0 sends each step's inputs to the others (`step_transport`),
every rank runs its shard, and only rank 0 samples. With more than one rank any fault (a rank's
death, a failed or timed-out collective, an error in a step) is an EngineDeadError: the engine
ends, never one batch.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from pytgi.config import CacheInfo, EngineConfig
from pytgi.distributed.parallel_state import destroy_distributed
from pytgi.errors import EngineDeadError, PytgiError
from pytgi.messages.executor import Executor
from pytgi.messages.outputs import ModelOutput, PendingMasks, SchedulerOutput
from pytgi.worker.step_transport import send_step
from pytgi.worker.supervisor import RankSupervisor
from pytgi.worker.worker import Worker

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
START_TIMEOUT_S = 300.0  # spawned ranks import torch and pytgi before they report in
_GLOO_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\]\s*")
RANK_EXIT_WAIT_S = 2.0  # after a failed collective: time for a crashed peer's exit to be seen


def _model_dir(config: EngineConfig):
    from pytgi.models.resolve import resolve_model

    return resolve_model(config.model)


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig):
        self.config = config
        self.worker: Worker | None = None

    def initialize(self) -> CacheInfo:
        self.worker = Worker(self.config, rank=0)
        return self.worker.initialize(_model_dir(self.config))

    def execute(
        self, scheduler_output: SchedulerOutput, grammar_masks: PendingMasks | None = None
    ) -> ModelOutput:
        return self.worker.runner.execute(scheduler_output, grammar_masks)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None


class MultiprocExecutor(Executor):
    """Rank 0 here, ranks 1..N-1 in processes that a RankSupervisor watches. A rank that dies, a
    failed collective, or one that waits past the collective timeout ends the engine (an
    EngineDeadError from `execute`, and `on_rank_death` at once from the monitor thread): the
    ranks may have stopped at different collectives, so no later step could be trusted."""

    def __init__(self, config: EngineConfig, on_rank_death: Callable[[str], None] | None = None):
        self.config = config
        self.worker: Worker | None = None
        self.supervisor = RankSupervisor(config, on_death=on_rank_death)
        self.ready = False  # every rank initialised and following rank 0's broadcasts
        self.broken = False  # a step failed: the ranks are out of step

    def initialize(self) -> CacheInfo:
        model_dir = _model_dir(self.config)
        self.supervisor.start(model_dir)
        try:
            self.supervisor.wait_started(START_TIMEOUT_S)
            self.worker = Worker(self.config, rank=0)
            cache_info = self.worker.initialize(model_dir)
        except Exception as exc:
            failure = self._start_failure(exc)
            self._shutdown_after_failed_start()
            if failure is exc:
                raise
            raise failure from None  # the rank's own error says why; this rank only saw it go
        self.ready = True
        return cache_info

    def execute(
        self, scheduler_output: SchedulerOutput, grammar_masks: PendingMasks | None = None
    ) -> ModelOutput:
        self.supervisor.check()
        try:  # rank 0's runner sends the step's inputs to the other ranks first
            return self.worker.runner.execute(scheduler_output, grammar_masks)
        except Exception as exc:
            raise self._step_failure(exc) from exc

    def shutdown(self) -> None:
        self.supervisor.stop_monitoring()
        released = self._release_ranks()
        self.supervisor.end_ranks(grace_s=SHUTDOWN_TIMEOUT_S if released else 0.0)
        self.ready = False
        if self.worker is not None:
            self.worker.shutdown()
            self.worker = None
        destroy_distributed()

    def _release_ranks(self) -> bool:
        """Tell the ranks to leave their step loop; False where they cannot follow (start-up
        failed, a step failed, a rank died): they are killed instead."""
        if not self.ready or self.broken or self.supervisor.death is not None:
            return False
        try:
            send_step(None)
        except Exception as exc:
            logger.warning("could not release the tensor-parallel ranks: %s", exc)
            return False
        return True

    def _start_failure(self, exc: Exception) -> Exception:
        """The error that says why start-up failed: rank 0's own typed error (a shard that cannot
        be built fails alike on every rank), else a rank's death, else what rank 0 saw."""
        if isinstance(exc, PytgiError) and not isinstance(exc, EngineDeadError):
            return exc
        return self._rank_death(exc)

    def _step_failure(self, exc: Exception) -> EngineDeadError:
        self.broken = True
        failure = self._rank_death(exc)
        if isinstance(failure, EngineDeadError):
            return failure
        message = f"a tensor-parallel step failed on rank 0: {_describe(exc)}"
        if "timed out" in message.lower():
            message += (
                f" (a rank did not answer within {self.config.parallel.collective_timeout_s:g}s, "
                "PYTGI_TP_COLLECTIVE_TIMEOUT_S)"
            )
        return EngineDeadError(message)

    def _rank_death(self, exc: Exception) -> Exception:
        """The dead rank's EngineDeadError if one died (give the monitor a moment), else `exc`."""
        if isinstance(exc, EngineDeadError):
            return exc
        try:
            self.supervisor.check(wait_s=RANK_EXIT_WAIT_S)
        except EngineDeadError as dead:
            return dead
        return exc

    def _shutdown_after_failed_start(self) -> None:
        try:
            self.shutdown()
        except Exception:  # never let clean-up hide why start-up failed
            logger.debug("clean-up after a failed start-up raised", exc_info=True)


def _describe(exc: Exception) -> str:
    """`RuntimeError: Timed out ...` without gloo's `[/path/to/file.cc:78] ` prefix."""
    return f"{type(exc).__name__}: {_GLOO_SOURCE_PREFIX.sub('', str(exc))}"


def create_executor(
    config: EngineConfig, on_rank_death: Callable[[str], None] | None = None
) -> Executor:
    """`on_rank_death(message)` is called once, from a monitor thread, when a tensor-parallel rank
    dies (never for a single shard)."""
    if config.parallel.num_shard == 1:
        return UniprocExecutor(config)
    return MultiprocExecutor(config, on_rank_death)
