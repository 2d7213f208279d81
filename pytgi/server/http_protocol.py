"""uvicorn's h11 protocol with read deadlines, so slow clients cannot hold connections forever.

uvicorn times out idle keep-alive connections but not a request being received: a client that
trickles its headers or body a byte at a time keeps its connection (and a worker's memory) for as
long as it likes. Here each request must deliver its headers within `header_timeout_s` of its
first byte (of the connection, for the first request) and then its body within `body_timeout_s`;
otherwise the connection is closed (an app waiting for the body sees a disconnect). Connections
are bounded by uvicorn's `limit_concurrency` (`--max-connections`): past it, requests get 503.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger(__name__)

_RECEIVED = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)


class DeadlineH11Protocol(H11Protocol):
    """Set `header_timeout_s` / `body_timeout_s` on a subclass (`with_deadlines`)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    _deadline: asyncio.TimerHandle | None = None
    _phase: str | None = None  # "headers" or "body" while a deadline is armed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers", self.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self._phase is None and self.conn.their_state is h11.IDLE:
            self._arm("headers", self.header_timeout_s)  # a new request on a kept-alive connection
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase == "headers":
            self._arm("body", self.body_timeout_s)
        elif state in _RECEIVED:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, phase: str, timeout_s: float) -> None:
        self._disarm()
        self._phase = phase
        self._deadline = self.loop.call_later(timeout_s, self._expired, phase, timeout_s)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._phase = None, None

    def _expired(self, phase: str, timeout_s: float) -> None:
        self._deadline, self._phase = None, None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "client"
        logger.info("%s: request %s not received within %.0fs, closing", client, phase, timeout_s)
        self.transport.close()


def with_deadlines(header_timeout_s: float, body_timeout_s: float) -> type[DeadlineH11Protocol]:
    """The protocol class to give uvicorn (`uvicorn.Config(http=...)`)."""
    return type(
        "ConfiguredDeadlineH11Protocol",
        (DeadlineH11Protocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
