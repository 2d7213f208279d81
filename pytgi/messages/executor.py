"""The engine's view of the workers: what `EngineCore` calls (pytgi.worker.executor implements
it for one rank in this process and for tensor-parallel ranks in their own processes)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pytgi.config import CacheInfo
from pytgi.messages.outputs import ModelOutput, SchedulerOutput


class Executor(ABC):
    @abstractmethod
    def initialize(self) -> CacheInfo:
        """Load the model on every rank, warm up, size and allocate the KV cache."""

    @abstractmethod
    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        """Run one step; returns the sampled tokens (and prefill logprobs) keyed by request id."""

    @abstractmethod
    def shutdown(self) -> None: ...
