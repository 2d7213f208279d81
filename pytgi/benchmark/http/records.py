"""The records that cross the benchmark's boundaries, and the one hook a new target implements.

`RequestSpec` (workload → sender), `RequestResult` (sender → runner, stats), `StreamRecorder`
(timestamps one streamed request) and `RequestSender` (the protocol the HTTP client implements;
the engine benchmark path implements it too, to reuse the sweeps, statistics and reports).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class RequestSpec:
    """One prompt to send, with the number of tokens to ask for."""

    prompt: str
    num_prompt_tokens: int  # as counted by the benchmark's tokenizer
    max_new_tokens: int


@dataclass
class RequestResult:
    """What one request did. Times are seconds; `start_s` is `time.perf_counter()` at send.

    `num_output_tokens` is the server's own count (`details.generated_tokens`, `usage`) when it
    reported one, else the number of token events seen (`output_tokens_source` says which).
    """

    start_s: float
    e2e_s: float
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive token events
    num_token_events: int = 0
    num_output_tokens: int = 0
    output_tokens_source: str = "events"  # "server" | "events"
    num_prompt_tokens: int = 0
    server_prompt_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)


class StreamRecorder:
    """Timestamps the token events of one streamed request and builds its `RequestResult`."""

    def __init__(self, spec: RequestSpec):
        self.spec = spec
        self.start_s = time.perf_counter()
        self._event_times_s: list[float] = []

    @property
    def num_token_events(self) -> int:
        return len(self._event_times_s)

    def record_token_event(self) -> None:
        self._event_times_s.append(time.perf_counter())

    def drop_first_token_event(self) -> None:
        """The first event turned out to carry no token (see `apis.ChatApi.is_token`)."""
        self._event_times_s.pop(0)

    def finish(
        self,
        error: str | None = None,
        server_output_tokens: int | None = None,
        server_prompt_tokens: int | None = None,
    ) -> RequestResult:
        times = self._event_times_s
        result = RequestResult(
            start_s=self.start_s,
            e2e_s=time.perf_counter() - self.start_s,
            ttft_s=times[0] - self.start_s if times else None,
            itl_s=[b - a for a, b in zip(times, times[1:], strict=False)],
            num_token_events=len(times),
            num_prompt_tokens=self.spec.num_prompt_tokens,
            server_prompt_tokens=server_prompt_tokens,
            error=error,
        )
        if server_output_tokens is not None:
            result.num_output_tokens = server_output_tokens
            result.output_tokens_source = "server"
        else:
            result.num_output_tokens = len(times)
        return result


class RequestSender(Protocol):
    """Sends one request and times its token stream.

    `send` never raises for a failed request: it returns a `RequestResult` whose `error` says what
    went wrong (connection refused, HTTP status, an error event, a timeout). Senders are created
    inside the running event loop and closed with `aclose` when the run ends.
    """

    async def send(self, spec: RequestSpec) -> RequestResult: ...

    async def aclose(self) -> None: ...
