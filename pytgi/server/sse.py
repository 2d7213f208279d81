"""Server-sent events: framing, keep-alive and client-disconnect handling.

Framing is `data: <compact json>\\n\\n`, with a space after the colon. TGI (axum) sends
`data:<json>`; every client we support parses both for JSON events, but huggingface_hub stops
only on the exact `data: [DONE]` and vLLM's benchmark strips the prefix `data: `, so the spaced
form is the one all of them accept (TGI_COMPATIBILITY.md §16). OpenAI routes end with
`data: [DONE]`; `/generate_stream` does not.

`EventStreamResponse` pulls frames from an async iterator in a producer task. While no frame
arrives for `keep_alive_s` it sends a `:` comment (TGI: 15 s). When the client disconnects it
cancels the producer once and then closes the iterator, so the route's `finally` blocks (and the
router stream below them, which aborts the engine request) run to completion.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pytgi.server.responses import dumps, encode_utf8

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"
KEEP_ALIVE = ":\n\n"
DEFAULT_KEEP_ALIVE_S = 15.0
_END = object()


def data_frame(payload: Any) -> str:
    """One SSE event carrying `payload` (a dict or a wire model) as compact JSON."""
    return f"data: {dumps(payload)}\n\n"


class EventStreamResponse(Response):
    """An ASGI response streaming SSE frames (strings) from `frames`."""

    media_type = "text/event-stream"
    charset = "utf-8"

    def __init__(
        self,
        frames: AsyncIterator[str],
        *,
        headers: Mapping[str, str] | None = None,
        keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
    ):
        # Response.__init__ is not called: it would render a body and set content-length
        self.frames = frames
        self.keep_alive_s = keep_alive_s
        self.status_code = 200
        self.background = None
        fixed = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        self.init_headers({**fixed, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        queue: asyncio.Queue[Any] = asyncio.Queue()  # unbounded: at most one frame per token
        producer = asyncio.create_task(self._produce(queue))
        watcher = asyncio.create_task(_wait_for_disconnect(receive))
        watcher.add_done_callback(lambda _: producer.cancel())
        try:
            completed = await self._forward(queue, send, watcher)
        finally:
            watcher.cancel()
            producer.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)
        if completed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _produce(self, queue: asyncio.Queue[Any]) -> None:
        try:
            async for frame in self.frames:
                queue.put_nowait(frame)
        except Exception:
            logger.exception("event stream failed")
        finally:
            await _close(self.frames)
            queue.put_nowait(_END)

    async def _forward(self, queue: asyncio.Queue[Any], send: Send, watcher: asyncio.Task) -> bool:
        """Send frames until the end (True) or the client left (False)."""
        while not watcher.done():
            try:
                frame = await asyncio.wait_for(queue.get(), self.keep_alive_s)
            except asyncio.TimeoutError:
                frame = KEEP_ALIVE
            if frame is _END:
                return not watcher.done()
            message = {"type": "http.response.body", "body": encode_utf8(frame), "more_body": True}
            try:
                await send(message)
            except OSError:  # ASGI 2.4 servers report a gone client here
                return False
        return False


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _close(frames: AsyncIterator[str]) -> None:
    aclose = getattr(frames, "aclose", None)
    if aclose is not None:
        await aclose()
