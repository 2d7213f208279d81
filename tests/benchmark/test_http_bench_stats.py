"""Percentiles, per-step summaries and the SLO verdict, on hand-built request records."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pytgi.benchmark.http.records import RequestResult
from pytgi.benchmark.http.stats import Distribution, percentile, summarize_step
from pytgi.benchmark.http.sweep import Slo


@pytest.mark.parametrize("size", [1, 2, 7, 100, 1001])
def test_percentile_matches_numpy_linear_interpolation(size):
    rng = random.Random(size)
    values = [rng.expovariate(1.0) for _ in range(size)]
    for pct in (0, 1, 50, 90, 95, 99, 100):
        assert percentile(values, pct) == pytest.approx(np.percentile(values, pct))


def test_distribution_is_ordered():
    dist = Distribution.of([5.0, 1.0, 3.0, 100.0, 2.0])
    assert dist.min <= dist.p50 <= dist.p90 <= dist.p95 <= dist.p99 <= dist.max
    assert dist.count == 5 and dist.mean == pytest.approx(22.2)
    assert Distribution.of([]) is None


def ok(start_s, e2e_s, ttft_s, tokens, itl_s=(), server=True):
    source = "server" if server else "events"
    return RequestResult(
        start_s, e2e_s, ttft_s, list(itl_s), len(itl_s) + 1, tokens, source, num_prompt_tokens=10
    )


def test_step_summary_counts_rates_and_latencies():
    results = [
        ok(0.0, 1.0, 0.2, 5, [0.2, 0.2, 0.2, 0.2]),
        ok(0.5, 1.5, 0.4, 3, [0.3, 0.3], server=False),
        RequestResult(1.0, 0.1, error="HTTP 503: Model is overloaded"),
        RequestResult(1.5, 0.1, error="HTTP 503: Model is overloaded"),
    ]
    summary = summarize_step("concurrency", 2, results, num_warmup=2)
    assert (summary.num_sent, summary.num_succeeded, summary.num_failed) == (4, 2, 2)
    assert summary.num_sent == summary.num_succeeded + summary.num_failed
    assert summary.error_rate == 0.5
    assert summary.duration_s == pytest.approx(2.0)  # first send at 0.0, last end at 2.0
    assert summary.request_throughput == pytest.approx(1.0)
    assert summary.output_token_throughput == pytest.approx(4.0)
    assert summary.input_token_throughput == pytest.approx(10.0)
    assert summary.achieved_rate == pytest.approx(2.0)  # 3 gaps over 1.5 s
    assert summary.num_output_tokens == 8 and summary.num_server_counted == 1
    assert summary.ttft_ms.p50 == pytest.approx(300.0)
    assert summary.itl_ms.count == 6 and summary.itl_ms.max == pytest.approx(300.0)
    assert summary.tpot_ms.min == pytest.approx(200.0)  # (1.0 - 0.2) / 4
    assert summary.e2e_ms.max == pytest.approx(1500.0)
    assert summary.errors == {"HTTP 503: Model is overloaded": 2}
    assert summary.label == "c=2"


def test_empty_and_all_failed_steps_have_no_latencies():
    empty = summarize_step("rate", 1.5, [], num_warmup=0)
    assert empty.num_sent == 0 and empty.error_rate == 0.0 and empty.ttft_ms is None
    failed = summarize_step("rate", 1.5, [RequestResult(0.0, 0.01, error="x")], 0)
    assert failed.error_rate == 1.0 and failed.request_throughput == 0.0
    assert failed.label == "1.5 req/s"


def test_slo_verdicts_name_what_was_missed():
    fast = summarize_step("rate", 1, [ok(0.0, 1.0, 0.1, 3, [0.01, 0.01])], 0)
    slow = summarize_step("rate", 2, [ok(0.0, 1.0, 0.9, 3, [0.05, 0.05])], 0)
    failing = summarize_step("rate", 4, [RequestResult(0.0, 0.1, error="boom")], 0)
    slo = Slo(ttft_ms=500, itl_ms=20, percentile=90)
    assert slo.is_set and not Slo().is_set
    assert slo.violations(fast) == []
    assert slo.violations(slow) == ["TTFT p90 900.0 ms > 500 ms", "ITL p90 50.0 ms > 20 ms"]
    assert slo.violations(failing) == ["no successful request"]
    mixed = summarize_step("rate", 3, [ok(0.0, 1.0, 0.1, 2, [0.01]), failing_result()], 0)
    assert slo.violations(mixed) == ["error rate 50.0% > 1.0%"]


def failing_result() -> RequestResult:
    return RequestResult(0.5, 0.1, error="boom")
