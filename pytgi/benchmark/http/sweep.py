"""Sweeps of load levels, the latency objective (SLO), and the search for the highest rate that
meets it.

A sweep runs its steps in order and stops early only when a step had no successful request (the
server is down or failing everything). The search doubles the rate from `rate_min` until a step
misses the SLO (or `rate_max` passes), then bisects between the last pass and the first miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pytgi.benchmark.http.progress import Progress
from pytgi.benchmark.http.records import RequestSender, RequestSpec
from pytgi.benchmark.http.runner import LoadLevel, StepLimits, StepResult, run_step
from pytgi.benchmark.http.stats import StepSummary, summarize_step


class SpecSource(Protocol):
    def build_specs(self, num_requests: int, step_index: int) -> list[RequestSpec]: ...


@dataclass(frozen=True)
class Slo:
    """Latency objective: TTFT and inter-token latency at `percentile`, and an error budget."""

    ttft_ms: float | None = None
    itl_ms: float | None = None
    percentile: int = 90
    max_error_rate: float = 0.01

    @property
    def is_set(self) -> bool:
        return self.ttft_ms is not None or self.itl_ms is not None

    def violations(self, summary: StepSummary) -> list[str]:
        """Why `summary` misses the objective (empty when it meets it)."""
        if summary.num_succeeded == 0:
            return ["no successful request"]
        reasons = []
        if summary.error_rate > self.max_error_rate:
            reasons.append(f"error rate {summary.error_rate:.1%} > {self.max_error_rate:.1%}")
        pct = self.percentile
        for name, limit_ms, dist in (
            ("TTFT", self.ttft_ms, summary.ttft_ms),
            ("ITL", self.itl_ms, summary.itl_ms),
        ):
            if limit_ms is not None and dist is not None and dist.at(pct) > limit_ms:
                reasons.append(f"{name} p{pct} {dist.at(pct):.1f} ms > {limit_ms:g} ms")
        return reasons


@dataclass(frozen=True)
class SweepPlan:
    mode: str  # "concurrency" | "rate" | "search" (rates, guided by the SLO)
    levels: tuple[float, ...] = ()
    rate_min: float = 0.5
    rate_max: float = 64.0
    num_bisections: int = 3


@dataclass
class StepRecord:
    summary: StepSummary
    result: StepResult
    slo_violations: list[str] | None = None  # None when no SLO was given

    @property
    def meets_slo(self) -> bool | None:
        return None if self.slo_violations is None else not self.slo_violations


@dataclass
class SweepOutcome:
    steps: list[StepRecord]
    best_load: float | None = None  # highest load level that met the SLO
    stop_reason: str | None = None
    interrupted: bool = False  # Ctrl-C: the steps are those that completed


class SweepRunner:
    def __init__(
        self,
        sender: RequestSender,
        workload: SpecSource,
        limits: StepLimits,
        slo: Slo,
        progress: Progress,
    ):
        self.sender = sender
        self.workload = workload
        self.limits = limits
        self.slo = slo
        self.progress = progress
        self.steps: list[StepRecord] = []

    async def run(self, plan: SweepPlan) -> SweepOutcome:
        if plan.mode == "search":
            await self._search(plan)
        else:
            for value in plan.levels:
                record = await self.run_level(LoadLevel(plan.mode, value))
                if record.summary.num_succeeded == 0:
                    break
        return self.outcome()

    def outcome(self, stop_reason: str | None = None) -> SweepOutcome:
        """The steps run so far, the best load among them, and why the sweep stopped early."""
        return SweepOutcome(self.steps, self._best_load(), stop_reason or self._stop_reason())

    async def run_level(self, level: LoadLevel) -> StepRecord:
        """Run one step with fresh prompts and judge it against the SLO."""
        num_warmup = self.limits.warmup_for(level)
        specs = self.workload.build_specs(num_warmup + self.limits.max_requests, len(self.steps))
        result = await run_step(self.sender, specs, level, self.limits, self.progress)
        summary = summarize_step(
            level.mode, level.value, result.results, num_warmup, result.stop_reason
        )
        violations = self.slo.violations(summary) if self.slo.is_set else None
        record = StepRecord(summary, result, violations)
        self.steps.append(record)
        return record

    async def _search(self, plan: SweepPlan) -> None:
        passed, failed = None, None
        rate = plan.rate_min
        while failed is None:
            record = await self.run_level(LoadLevel("rate", rate))
            if record.summary.num_succeeded == 0:
                return
            if record.meets_slo:
                passed = rate
            else:
                failed = rate
            if rate >= plan.rate_max:
                break
            rate = min(rate * 2, plan.rate_max)
        if passed is None or failed is None:
            return
        for _ in range(plan.num_bisections):
            rate = round((passed + failed) / 2, 3)
            record = await self.run_level(LoadLevel("rate", rate))
            if record.summary.num_succeeded == 0:
                return
            passed, failed = (rate, failed) if record.meets_slo else (passed, rate)

    def _best_load(self) -> float | None:
        passing = [s.summary.load for s in self.steps if s.meets_slo]
        return max(passing, default=None)

    def _stop_reason(self) -> str | None:
        last = self.steps[-1].summary if self.steps else None
        if last is None or last.num_succeeded > 0:
            return None
        first_error = next(iter(last.errors), "unknown error")
        return (
            last.stop_reason
            or f"all {last.num_sent} requests of {last.label} failed: {first_error}"
        )
