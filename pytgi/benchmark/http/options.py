"""`BenchOptions`: the validated settings of one `pytgi bench` run, built from parsed flags.

Everything a flag can get wrong is checked here, before any request is sent, and reported as a
`BenchConfigError` naming the flag.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.runner import StepLimits
from pytgi.benchmark.http.sweep import Slo, SweepPlan
from pytgi.benchmark.http.workload import WorkloadConfig

SLO_PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class BenchOptions:
    url: str | None
    api: str
    model: str | None
    api_key: str | None
    tokenizer_name: str
    tokenizer_revision: str | None
    workload: WorkloadConfig
    plan: SweepPlan
    limits: StepLimits
    slo: Slo
    request_timeout_s: float
    temperature: float | None
    ignore_eos: bool
    output_dir: Path
    name: str | None
    progress: bool
    plots: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        if not args.tokenizer_name:
            raise BenchConfigError("--tokenizer-name is required (a path or a hub id)")
        _positive(args, "duration", "max_requests", "request_timeout", "max_concurrency")
        _positive(args, "abort_after_failures")
        return cls(
            url=args.url,
            api=args.api,
            model=args.model,
            api_key=args.api_key,
            tokenizer_name=args.tokenizer_name,
            tokenizer_revision=args.tokenizer_revision,
            workload=_workload(args),
            plan=_plan(args),
            limits=StepLimits(
                duration_s=args.duration,
                max_requests=args.max_requests,
                num_warmup=args.warmup_requests,
                max_concurrency=args.max_concurrency,
                abort_after_failures=args.abort_after_failures,
                seed=args.seed,
            ),
            slo=_slo(args),
            request_timeout_s=args.request_timeout,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
            output_dir=Path(args.output_dir),
            name=args.name,
            progress=not args.no_progress,
            plots=not args.no_plots,
        )

    def settings(self) -> dict[str, Any]:
        """What shaped the numbers, for the results file."""
        workload, plan, limits = self.workload, self.plan, self.limits
        search = plan.mode == "search"
        return {
            "workload": {
                "profile": workload.profile,
                "prompt_tokens": workload.prompt_lengths.describe(),
                "output_tokens": workload.output_lengths.describe(),
                "prompts_file": str(workload.prompts_file) if workload.prompts_file else None,
                "seed": workload.seed,
            },
            "plan": {
                "mode": plan.mode,
                "levels": list(plan.levels),
                **({"rate_min": plan.rate_min, "rate_max": plan.rate_max} if search else {}),
                **({"bisections": plan.num_bisections} if search else {}),
            },
            "bounds": {
                "duration_s": limits.duration_s,
                "max_requests": limits.max_requests,
                "warmup_requests": "auto" if limits.num_warmup is None else limits.num_warmup,
                "max_concurrency": limits.max_concurrency,
                "request_timeout_s": self.request_timeout_s,
            },
            "sampling": {"temperature": self.temperature, "ignore_eos": self.ignore_eos},
        }


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name) <= 0:
            raise BenchConfigError(f"--{name.replace('_', '-')} must be > 0")


def _workload(args: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(
        profile=args.profile,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        prompts_file=Path(args.prompts_file) if args.prompts_file else None,
        seed=args.seed,
    )


def _plan(args: argparse.Namespace) -> SweepPlan:
    chosen = [flag for flag in ("concurrency", "rates", "find_max_rate") if getattr(args, flag)]
    if len(chosen) > 1:
        raise BenchConfigError("choose one of --concurrency, --rates and --find-max-rate")
    if args.find_max_rate:
        if args.slo_ttft_ms is None and args.slo_itl_ms is None:
            raise BenchConfigError("--find-max-rate needs an objective: --slo-ttft-ms/--slo-itl-ms")
        if not 0 < args.rate_min <= args.rate_max:
            raise BenchConfigError("--rate-min and --rate-max must satisfy 0 < min <= max")
        return SweepPlan("search", (), args.rate_min, args.rate_max, args.bisections)
    if args.rates:
        return SweepPlan("rate", _levels(args.rates, "--rates", float))
    return SweepPlan("concurrency", _levels(args.concurrency or "1", "--concurrency", int))


def _levels(text: str, flag: str, kind: type) -> tuple[float, ...]:
    try:
        levels = tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BenchConfigError(
            f"{flag} takes a comma-separated list of numbers, got '{text}'"
        ) from None
    if not levels or any(level <= 0 for level in levels):
        raise BenchConfigError(f"{flag} values must be > 0, got '{text}'")
    return levels


def _slo(args: argparse.Namespace) -> Slo:
    if args.slo_percentile not in SLO_PERCENTILES:
        raise BenchConfigError(f"--slo-percentile must be one of {SLO_PERCENTILES}")
    if not 0.0 <= args.slo_max_error_rate <= 1.0:
        raise BenchConfigError("--slo-max-error-rate must be in [0, 1]")
    return Slo(args.slo_ttft_ms, args.slo_itl_ms, args.slo_percentile, args.slo_max_error_rate)
