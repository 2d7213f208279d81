"""The engine's view of the workers: what `EngineCore` calls (pytgi.worker.executor implements
it for one rank in this process and for tensor-parallel ranks in their own processes)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pytgi.config import CacheInfo
from pytgi.messages.outputs import ModelOutput, PendingMasks, SchedulerOutput


class Executor(ABC):
    @abstractmethod
    def initialize(self) -> CacheInfo:
        """Load the model on every rank, warm up, size and allocate the KV cache."""

    @abstractmethod
    def execute(
        self, scheduler_output: SchedulerOutput, grammar_masks: PendingMasks | None = None
    ) -> ModelOutput:
        """Run one step; returns the sampled tokens (and prefill logprobs) keyed by request id.
        `grammar_masks`: the step's token masks being filled; wait for them before sampling."""

    @abstractmethod
    def shutdown(self) -> None: ...
