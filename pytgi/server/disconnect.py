"""Stop non-streaming work when the HTTP client goes away.

A non-streaming handler only talks to the client once, at the end, so without a watch a dropped
connection would let the generation run to completion (vLLM #54947). `until_disconnected` races
the work against the ASGI `http.disconnect` message and cancels the work when the client leaves;
the router's generation, being cancelled, aborts its engine request. Streams are watched by
`sse.EventStreamResponse` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from starlette.responses import Response

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for "client closed request"; nobody receives it


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client disconnects first, cancel it and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def on_client_disconnected(request: Request, exc: ClientDisconnected) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)
