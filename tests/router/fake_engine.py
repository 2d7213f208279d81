"""A scripted EngineClient: each request gets the deltas a script returns; records aborts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from pytgi.engine.client import EngineStats
from pytgi.engine.outputs import RequestOutput, SampledToken
from pytgi.engine.request import EngineRequest, FinishReason

Script = Callable[[EngineRequest], list[RequestOutput]]


def token_deltas(
    request: EngineRequest,
    ids: list[int],
    finish: FinishReason | None = FinishReason.LENGTH,
    logprob: float = -0.5,
) -> list[RequestOutput]:
    """One delta per token; the last one finished with `finish` (None: the stream just ends)."""
    n = request.sampling.top_n_tokens
    deltas = []
    for k, token_id in enumerate(ids):
        top_ids = [token_id] + [t for t in (65, 66, 67, 68, 69) if t != token_id][: max(n - 1, 0)]
        token = SampledToken(token_id, logprob, top_ids[:n], [logprob - i for i in range(n)])
        last = k == len(ids) - 1 and finish is not None
        deltas.append(
            RequestOutput(
                request.request_id,
                new_tokens=[token],
                finished=last,
                finish_reason=finish if last else None,
                num_prompt_tokens=len(request.prompt_ids),
                queue_time_s=0.01 if k == 0 else 0.0,
            )
        )
    return deltas


class FakeEngine:
    def __init__(self, script: Script, *, delay_s: float = 0.0):
        self.script = script
        self.delay_s = delay_s
        self.requests: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self.cache_info = None

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        return self._stream(request)

    async def _stream(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            for delta in self.script(request):
                await asyncio.sleep(self.delay_s)
                finished = delta.finished
                yield delta
        finally:
            (self.completed if finished else self.aborted).append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats()

    @property
    def is_alive(self) -> bool:
        return True

    async def shutdown(self) -> None:
        return None
