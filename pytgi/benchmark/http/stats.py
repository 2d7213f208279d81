"""Per-step statistics: percentiles of TTFT, inter-token latency, time per output token and
end-to-end latency (milliseconds), throughputs, error rate and the most frequent errors.

Only measured requests count (warm-up requests are excluded). Throughputs divide by the step's
measurement window: from the first measured send to the last measured completion.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from pytgi.benchmark.http.records import RequestResult

PERCENTILES = (50, 90, 95, 99)
MAX_ERROR_KINDS = 5


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `values` must be non-empty."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        if not values:
            return None
        pcts = {f"p{p}": percentile(values, p) for p in PERCENTILES}
        return cls(len(values), sum(values) / len(values), min(values), max=max(values), **pcts)

    def at(self, pct: int) -> float:
        return getattr(self, f"p{pct}")


@dataclass(frozen=True)
class StepSummary:
    """The numbers of one load level. `load` is a concurrency or a request rate (req/s)."""

    mode: str  # "concurrency" | "rate"
    load: float
    num_sent: int
    num_succeeded: int
    num_failed: int
    num_warmup: int
    duration_s: float
    request_throughput: float  # successful requests / s
    output_token_throughput: float  # output tokens of successful requests / s
    input_token_throughput: float
    achieved_rate: float  # measured sends / s (the rate the server actually got)
    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    e2e_ms: Distribution | None
    output_tokens: Distribution | None
    num_output_tokens: int
    num_server_counted: int  # successes whose token count the server reported
    errors: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None

    @property
    def error_rate(self) -> float:
        return self.num_failed / self.num_sent if self.num_sent else 0.0

    @property
    def label(self) -> str:
        return f"c={self.load:g}" if self.mode == "concurrency" else f"{self.load:g} req/s"

    def to_dict(self) -> dict:
        return {**asdict(self), "error_rate": self.error_rate, "label": self.label}


def summarize_step(
    mode: str,
    load: float,
    results: list[RequestResult],
    num_warmup: int,
    stop_reason: str | None = None,
) -> StepSummary:
    ok = [r for r in results if r.ok]
    duration_s = _window_s(results)
    num_output_tokens = sum(r.num_output_tokens for r in ok)
    return StepSummary(
        mode=mode,
        load=load,
        num_sent=len(results),
        num_succeeded=len(ok),
        num_failed=len(results) - len(ok),
        num_warmup=num_warmup,
        duration_s=duration_s,
        request_throughput=_rate(len(ok), duration_s),
        output_token_throughput=_rate(num_output_tokens, duration_s),
        input_token_throughput=_rate(sum(_prompt_tokens(r) for r in ok), duration_s),
        achieved_rate=_send_rate(results),
        ttft_ms=Distribution.of([r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]),
        itl_ms=Distribution.of([gap * 1e3 for r in ok for gap in r.itl_s]),
        tpot_ms=Distribution.of([r.tpot_s * 1e3 for r in ok if r.tpot_s is not None]),
        e2e_ms=Distribution.of([r.e2e_s * 1e3 for r in ok]),
        output_tokens=Distribution.of([float(r.num_output_tokens) for r in ok]),
        num_output_tokens=num_output_tokens,
        num_server_counted=sum(r.output_tokens_source == "server" for r in ok),
        errors=dict(Counter(r.error for r in results if r.error).most_common(MAX_ERROR_KINDS)),
        stop_reason=stop_reason,
    )


def _prompt_tokens(result: RequestResult) -> int:
    if result.server_prompt_tokens is not None:
        return result.server_prompt_tokens
    return result.num_prompt_tokens


def _window_s(results: list[RequestResult]) -> float:
    if not results:
        return 0.0
    return max(r.start_s + r.e2e_s for r in results) - min(r.start_s for r in results)


def _send_rate(results: list[RequestResult]) -> float:
    if len(results) < 2:
        return 0.0
    starts = sorted(r.start_s for r in results)
    return _rate(len(starts) - 1, starts[-1] - starts[0])


def _rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0
