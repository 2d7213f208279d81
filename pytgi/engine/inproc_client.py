"""InprocEngineClient: the EngineCore steps in a background thread of this process.

Used by tests and by the offline API's async users. Commands (add, abort) go through a thread-safe
queue and are applied between steps; deltas come back to the event loop with `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator

from pytgi.engine.client import EngineStats, apply_commands
from pytgi.engine.engine_core import EngineCore
from pytgi.engine.stream import OutputRouter
from pytgi.messages.outputs import RequestOutput
from pytgi.messages.request import EngineRequest

logger = logging.getLogger(__name__)


class InprocEngineClient:
    def __init__(self, core: EngineCore):
        self.core = core
        self.cache_info = core.cache_info
        self._commands: queue.Queue = queue.Queue()
        self._router = OutputRouter(self._send_abort)
        self._stats = core.stats()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pytgi-engine", daemon=True)
        self._thread.start()

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        stream = self._router.open(request.request_id)
        self._commands.put(("add", request))
        return stream

    async def abort(self, request_id: str) -> None:
        self._send_abort(request_id)

    def _send_abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self._error is None

    async def shutdown(self) -> None:
        self._stop.set()
        self._commands.put(("stop", None))
        await asyncio.to_thread(self._thread.join, 30)
        self.core.shutdown()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if apply_commands(self.core, self._commands, not self.core.has_unfinished()) < 0:
                    return
                outputs = self.core.step()
                self._stats = self.core.stats()
                if outputs:
                    self._router.deliver(outputs)
        except Exception as exc:  # the engine is dead: fail every open stream
            logger.exception("engine loop died")
            self._error = exc
            self._router.fail_all(f"{type(exc).__name__}: {exc}")
