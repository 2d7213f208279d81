"""`HealthState`: the server's lifecycle as the launcher drives it, and the in-flight request count.

The launcher owns the transitions: `starting` until warm-up is done, `ready` while serving,
`draining` after SIGTERM (new generation requests get 503; in-flight ones finish), `dead` when the
engine is gone. `/health` answers 200 only when `ready` and the engine is alive.
"""

from __future__ import annotations

import asyncio
import enum


class Health(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    DEAD = "dead"


class HealthState:
    """Mutable server state shared by the routes, the middleware and the launcher."""

    def __init__(self, status: Health = Health.READY):
        self.status = status
        self.num_inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def accepting(self) -> bool:
        return self.status == Health.READY

    def set(self, status: Health | str) -> None:
        self.status = Health(status)

    def request_started(self) -> None:
        self.num_inflight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.num_inflight -= 1
        if self.num_inflight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no request is in flight (graceful drain); False on timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
