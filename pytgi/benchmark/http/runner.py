"""One benchmark step: hold a concurrency level, or send at a Poisson rate, until a bound is hit.

A step sends a stream of requests; the first `num_warmup` of them warm the server (caches,
batches at steady state) and are left out of the statistics, without pausing the load. The
measured phase ends when `max_requests` measured requests were sent or `duration_s` passed since
the first of them; in-flight requests then finish (each is bounded by the sender's timeout). A
step whose first `abort_after_failures` requests all failed stops early: the server is down.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pytgi.benchmark.http.progress import Progress
from pytgi.benchmark.http.records import RequestResult, RequestSender, RequestSpec

SendFn = Callable[[int, RequestSpec], Awaitable[None]]


@dataclass(frozen=True)
class LoadLevel:
    mode: str  # "concurrency" | "rate"
    value: float  # in-flight requests, or requests per second

    @property
    def label(self) -> str:
        return f"c={self.value:g}" if self.mode == "concurrency" else f"{self.value:g} req/s"


@dataclass(frozen=True)
class StepLimits:
    duration_s: float
    max_requests: int
    num_warmup: int | None = None  # None: one per concurrency slot, or one second of arrivals
    max_concurrency: int = 256  # cap on in-flight requests at a rate
    abort_after_failures: int = 10
    seed: int = 0

    def warmup_for(self, level: LoadLevel) -> int:
        if self.num_warmup is not None:
            return self.num_warmup
        if level.mode == "concurrency":
            return int(level.value)
        return min(self.max_concurrency, max(1, math.ceil(level.value)))


@dataclass
class StepResult:
    level: LoadLevel
    results: list[RequestResult] = field(default_factory=list)  # measured, in send order
    warmup_results: list[RequestResult] = field(default_factory=list)
    stop_reason: str | None = None  # set when the step ended early


class _StepState:
    """Hands out specs in order and decides when the step stops."""

    def __init__(self, specs: list[RequestSpec], num_warmup: int, limits: StepLimits):
        self.specs = specs
        self.num_warmup = num_warmup
        self.limits = limits
        self.num_issued = 0
        self.deadline_s = math.inf
        self.num_ok = self.num_failed = 0
        self.stop_reason: str | None = None
        self.first_error: str | None = None

    def next_request(self) -> tuple[int, RequestSpec] | None:
        if self.stop_reason is not None or self.num_issued >= len(self.specs):
            return None
        now = time.perf_counter()
        if now >= self.deadline_s:
            return None
        if self.num_issued == self.num_warmup:
            self.deadline_s = now + self.limits.duration_s
        index = self.num_issued
        self.num_issued += 1
        return index, self.specs[index]

    def record(self, result: RequestResult) -> None:
        if result.ok:
            self.num_ok += 1
            return
        self.num_failed += 1
        self.first_error = self.first_error or result.error
        if self.num_ok == 0 and self.num_failed >= self.limits.abort_after_failures:
            self.stop_reason = (
                f"stopped after {self.num_failed} failed requests and no success; "
                f"first error: {self.first_error}"
            )


async def run_step(
    sender: RequestSender,
    specs: list[RequestSpec],
    level: LoadLevel,
    limits: StepLimits,
    progress: Progress,
) -> StepResult:
    """Run one load level with `specs` (warm-up first; at most `len(specs)` requests)."""
    num_warmup = min(limits.warmup_for(level), len(specs))
    state = _StepState(specs, num_warmup, limits)
    step = StepResult(level)
    progress.start(level.label, total=len(specs) - num_warmup, duration_s=limits.duration_s)

    async def send(index: int, spec: RequestSpec) -> None:
        result = await sender.send(spec)
        state.record(result)
        if index < num_warmup:
            step.warmup_results.append(result)
        else:
            step.results.append(result)
            progress.update(result)

    try:
        if level.mode == "concurrency":
            await _hold_concurrency(state, int(level.value), send)
        else:
            await _poisson_arrivals(state, level.value, limits, send)
    finally:
        progress.close()
    step.results.sort(key=lambda r: r.start_s)
    step.stop_reason = state.stop_reason
    return step


async def _hold_concurrency(state: _StepState, concurrency: int, send: SendFn) -> None:
    async def worker() -> None:
        while (item := state.next_request()) is not None:
            await send(*item)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))


async def _poisson_arrivals(
    state: _StepState, rate: float, limits: StepLimits, send: SendFn
) -> None:
    """Exponential gaps at `rate` on an absolute schedule (a late send does not shift the next)."""
    rng = random.Random(f"arrivals:{limits.seed}:{rate}")
    slots = asyncio.Semaphore(limits.max_concurrency)
    tasks: set[asyncio.Task] = set()

    async def send_in_slot(index: int, spec: RequestSpec) -> None:
        try:
            await send(index, spec)
        finally:
            slots.release()

    next_send_s = time.perf_counter()
    while True:
        wake_s = min(next_send_s, state.deadline_s)  # a step ends on time, not at its next arrival
        await asyncio.sleep(max(0.0, wake_s - time.perf_counter()))
        await slots.acquire()
        item = state.next_request()
        if item is None:
            slots.release()
            break
        task = asyncio.create_task(send_in_slot(*item))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        next_send_s += rng.expovariate(rate)
    await asyncio.gather(*tasks)
