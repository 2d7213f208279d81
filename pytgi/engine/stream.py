"""OutputRouter: per-request async streams fed from a non-asyncio thread.

Each `open(request_id)` returns an async iterator bound to the caller's event loop. `deliver` may be
called from any thread; closing a stream before its final delta calls `on_abort(request_id)` so the
engine drops the request (client disconnect, stop string matched).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from pytgi.messages.outputs import RequestOutput


class OutputRouter:
    def __init__(self, on_abort: Callable[[str], None]):
        self._on_abort = on_abort
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()

    def open(self, request_id: str) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if request_id in self._queues:
                raise ValueError(f"duplicate request id {request_id}")
            self._queues[request_id] = (loop, q)
        return self._iterate(request_id, q)

    async def _iterate(self, request_id: str, q: asyncio.Queue) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                delta: RequestOutput = await q.get()
                finished = delta.finished
                yield delta
                if finished:
                    return
        finally:
            with self._lock:
                self._queues.pop(request_id, None)
            if not finished:
                self._on_abort(request_id)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            targets = [(self._queues.get(o.request_id), o) for o in outputs]
        for target, output in targets:
            if target is None:
                continue
            loop, q = target
            try:
                loop.call_soon_threadsafe(q.put_nowait, output)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                continue

    def fail_all(self, error: str) -> None:
        with self._lock:
            ids = list(self._queues)
        self.deliver([RequestOutput(rid, finished=True, error=error) for rid in ids])
