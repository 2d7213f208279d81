"""Fan-in helpers for routes that run several generations (`/v1/completions` with many prompts).

Both stop every other generation at the first error, and closing a merged stream closes each
source (which aborts its engine request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


async def gather_or_cancel(awaitables: Sequence[Awaitable[T]]) -> list[T]:
    """Like `asyncio.gather`, but the first failure cancels the others before it is raised."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(index: int, source: AsyncIterator[Any], queue: asyncio.Queue) -> None:
    try:
        async for item in source:
            queue.put_nowait((index, item, None))
    except Exception as exc:  # handed to the consumer, which re-raises it
        queue.put_nowait((index, None, exc))
    finally:
        try:
            await source.aclose()  # type: ignore[attr-defined]
        finally:
            queue.put_nowait((index, _DONE, None))


async def merge_streams(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave `sources` as `(source index, item)` in arrival order."""
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(i, s, queue)) for i, s in enumerate(sources)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is _DONE:
                remaining -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
