"""The one interface between the API process and the engine: `EngineClient`.

Two implementations share it: `InprocEngineClient` (the EngineCore steps in a background thread of
this process: tests and the offline API) and `MultiprocEngineClient` (the EngineCore runs in its own
process: the default for `serve`, so the HTTP event loop never waits for a forward pass).
"""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from pytgi.config import CacheInfo
from pytgi.messages.outputs import RequestOutput
from pytgi.messages.request import EngineRequest


@dataclass
class EngineStats:
    """A snapshot of the engine for /metrics and /info (counters are cumulative)."""

    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks: int = 0
    num_free_kv_blocks: int = 0
    num_batch_tokens: int = 0  # tokens run in the last step
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    num_preemptions: int = 0
    num_aborts: int = 0
    num_steps: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_draft_tokens: int = 0  # speculative tokens verified (--speculate)
    num_accepted_draft_tokens: int = 0
    num_draft_steps: int = 0  # request-steps that verified at least one draft
    # steps with running requests where the speculation policy verified drafts / did not
    num_speculation_steps_drafted: int = 0
    num_speculation_steps_skipped: int = 0
    forward_time_s: float = 0.0  # cumulative time in Executor.execute

    @property
    def kv_cache_usage(self) -> float:
        if self.num_kv_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_kv_blocks / self.num_kv_blocks


class EngineClient(Protocol):
    """Submit token-level requests to the engine and stream back their deltas.

    `generate(request)` yields `RequestOutput` deltas until one has `finished=True`. If the consumer
    stops iterating early (the HTTP client went away, a stop string matched) the iterator's
    `aclose()` aborts the request in the engine, which frees its KV blocks at the next step; a
    queued request is never scheduled. A request the engine failed ends with a delta whose `error`
    is set.
    """

    cache_info: CacheInfo

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...

    @property
    def is_alive(self) -> bool: ...

    async def shutdown(self) -> None: ...


def apply_commands(core: Any, commands: Any, block: bool) -> int:
    """Apply the queued `(kind, payload)` commands ("add", "abort", "stop") to an `EngineCore`,
    waiting up to 0.5 s for the first one when `block`; returns how many, or -1 on "stop".

    `commands` is a `queue.Queue` or a `multiprocessing` queue (both raise `queue.Empty`).
    """
    try:
        command = commands.get(timeout=0.5) if block else commands.get_nowait()
    except queue.Empty:
        return 0
    num_applied = 0
    while True:
        kind, payload = command
        if kind == "stop":
            return -1
        if kind == "add":
            core.add_request(payload)
        elif kind == "abort":
            core.abort(payload)
        num_applied += 1
        try:
            command = commands.get_nowait()
        except queue.Empty:
            return num_applied
