"""Steps and sweeps against the fake server: concurrency, rates, bounds, warm-up, SLO search."""

from __future__ import annotations

import asyncio
import time

import pytest

from pytgi.benchmark.http.apis import ApiOptions, make_api
from pytgi.benchmark.http.client import HttpSender
from pytgi.benchmark.http.progress import NoProgress
from pytgi.benchmark.http.runner import LoadLevel, StepLimits
from pytgi.benchmark.http.sweep import Slo, SweepPlan, SweepRunner
from pytgi.benchmark.http.tokenizer import load_tokenizer
from pytgi.benchmark.http.workload import Workload, WorkloadConfig


@pytest.fixture(scope="module")
def workload(bench_tokenizer_dir):
    config = WorkloadConfig(prompt_tokens="uniform:4,16", output_tokens="uniform:3,8")
    return Workload(config, load_tokenizer(str(bench_tokenizer_dir)))


def sweep(url, workload, plan, limits, slo=Slo(), api="tgi"):
    async def go():
        sender = HttpSender(url, make_api(api, ApiOptions()), 10, 64)
        try:
            return await SweepRunner(sender, workload, limits, slo, NoProgress()).run(plan)
        finally:
            await sender.aclose()

    return asyncio.run(go())


def test_concurrency_sweep_holds_each_level_and_counts_add_up(fake_server, workload):
    fake_server.reset(token_delay_s=0.003)
    limits = StepLimits(duration_s=10, max_requests=12, num_warmup=2)
    outcome = sweep(fake_server.url, workload, SweepPlan("concurrency", (1, 4)), limits)
    assert [s.summary.load for s in outcome.steps] == [1, 4]
    for step in outcome.steps:
        summary = step.summary
        assert summary.num_sent == 12 == summary.num_succeeded + summary.num_failed
        assert summary.num_failed == 0 and len(step.result.warmup_results) == 2
        assert summary.ttft_ms.p50 <= summary.ttft_ms.p90 <= summary.ttft_ms.p99
        assert summary.itl_ms.p50 <= summary.itl_ms.p90 <= summary.itl_ms.p99
    # the server saw every request, warm-ups included, and never more than 4 at once
    assert fake_server.stats.num_requests == 2 * (12 + 2)
    assert fake_server.stats.max_inflight == 4
    measured = sum(s.summary.num_output_tokens for s in outcome.steps)
    warmup = sum(r.num_output_tokens for s in outcome.steps for r in s.result.warmup_results)
    assert measured + warmup == fake_server.stats.num_generated_tokens
    assert outcome.best_load is None and outcome.stop_reason is None


def test_duration_bounds_a_step(fake_server, workload):
    fake_server.reset(token_delay_s=0.02)  # 60-160 ms per request
    limits = StepLimits(duration_s=0.4, max_requests=1000, num_warmup=0)
    started = time.perf_counter()
    outcome = sweep(fake_server.url, workload, SweepPlan("concurrency", (2,)), limits)
    elapsed = time.perf_counter() - started
    summary = outcome.steps[0].summary
    assert 2 <= summary.num_sent < 40
    assert elapsed < 3.0
    assert (
        max(r.start_s for r in outcome.steps[0].result.results)
        - min(r.start_s for r in outcome.steps[0].result.results)
        <= 0.4 + 0.05
    )


def test_poisson_rate_is_respected_and_in_flight_is_capped(fake_server, workload):
    fake_server.reset(token_delay_s=0.02)  # 60-160 ms per request: many overlap
    limits = StepLimits(duration_s=10, max_requests=15, num_warmup=0, max_concurrency=3)
    outcome = sweep(fake_server.url, workload, SweepPlan("rate", (200.0,)), limits)
    summary = outcome.steps[0].summary
    assert summary.num_sent == 15 and summary.num_failed == 0
    assert fake_server.stats.max_inflight == 3  # arrivals wait for a free slot
    fake_server.reset(token_delay_s=0.001)
    limits = StepLimits(duration_s=10, max_requests=25, num_warmup=0)
    summary = sweep(fake_server.url, workload, SweepPlan("rate", (50.0,)), limits).steps[0].summary
    assert 20 < summary.achieved_rate < 125  # Poisson: about 50 req/s, with sampling noise


def test_auto_warmup_is_one_per_slot_or_one_second_of_arrivals():
    limits = StepLimits(duration_s=1, max_requests=1)
    assert limits.warmup_for(LoadLevel("concurrency", 8)) == 8
    assert limits.warmup_for(LoadLevel("rate", 2.5)) == 3
    assert limits.warmup_for(LoadLevel("rate", 0.2)) == 1
    assert StepLimits(1, 1, num_warmup=0).warmup_for(LoadLevel("rate", 9)) == 0


def test_failing_server_stops_the_step_and_the_sweep(fake_server, workload):
    fake_server.reset(error_mode="http")
    limits = StepLimits(duration_s=10, max_requests=100, num_warmup=1, abort_after_failures=5)
    outcome = sweep(fake_server.url, workload, SweepPlan("concurrency", (1, 2, 4)), limits)
    assert len(outcome.steps) == 1
    summary = outcome.steps[0].summary
    assert summary.num_succeeded == 0 and summary.num_sent == summary.num_failed == 4
    assert "stopped after 5 failed requests" in outcome.stop_reason
    assert "HTTP 503: Model is overloaded" in outcome.stop_reason


def test_slo_search_finds_the_highest_passing_rate(fake_server, workload):
    # Latency grows with the number of requests in flight, so fast rates miss the objective.
    # A lone request (rate 1 in 0.3 s) never overlaps another, so the first probe passes.
    fake_server.reset(first_token_delay_s=0.002, token_delay_s=0.002, delay_per_inflight_s=0.05)
    limits = StepLimits(duration_s=0.3, max_requests=12, num_warmup=0)
    slo = Slo(itl_ms=40, percentile=90, max_error_rate=0.0)
    plan = SweepPlan("search", rate_min=1, rate_max=64, num_bisections=2)
    outcome = sweep(fake_server.url, workload, plan, limits, slo, api="chat")
    rates = [s.summary.load for s in outcome.steps]
    verdicts = {s.summary.load: s.meets_slo for s in outcome.steps}
    assert verdicts[1], "the lowest rate should meet the objective"
    num_doubling = next(i for i, rate in enumerate(rates) if not verdicts[rate]) + 1
    assert rates[:num_doubling] == [2**i for i in range(num_doubling)]
    low, high = rates[num_doubling - 2], rates[num_doubling - 1]
    assert len(rates) == num_doubling + 2  # then two bisection probes inside the bracket
    for rate in rates[num_doubling:]:
        assert low < rate < high
        low, high = (rate, high) if verdicts[rate] else (low, rate)
    assert outcome.best_load == low


def test_slo_search_reports_none_when_even_the_lowest_rate_misses(fake_server, workload):
    fake_server.reset(first_token_delay_s=0.05)
    limits = StepLimits(duration_s=0.3, max_requests=3, num_warmup=0)
    plan = SweepPlan("search", rate_min=4, rate_max=16, num_bisections=2)
    outcome = sweep(fake_server.url, workload, plan, limits, Slo(ttft_ms=10))
    assert [s.summary.load for s in outcome.steps] == [4]
    assert outcome.best_load is None and outcome.steps[0].meets_slo is False
