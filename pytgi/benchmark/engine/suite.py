"""The benchmark run: measure the machine, load both engines once, then run every workload.

For each workload: untimed warm-ups, then `repeats` rounds; in each round every system (pytgi, then
the baselines: transformers generate, or pytgi through its transformers fallback) serves the same
fresh random prompts, one system at a time, never concurrently. The reported figures are
per-system medians over the rounds.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from pytgi.benchmark.engine.machine import machine_info
from pytgi.benchmark.engine.metrics import RunMetrics, median_metrics, summarize
from pytgi.benchmark.engine.roofline import (
    MachineRoofline,
    ModelFootprint,
    measure_machine,
    model_footprint,
)
from pytgi.benchmark.engine.trace import RunTrace
from pytgi.benchmark.engine.workloads import Workload, random_prompts, warmup_workload

BASELINES = ("hf_sequential", "hf_static")
FALLBACK_BASELINE = "pytgi_transformers"  # pytgi on the same checkpoint through its fallback
RATIO_METRICS = ("output_tok_s", "decode_tok_s", "prefill_tok_s", "ttft_p50_ms")

Runner = Callable[[Workload, list[list[int]]], RunTrace]


@dataclass(frozen=True)
class BenchOptions:
    model_id: str
    workloads: tuple[Workload, ...]
    dtype: str = "float32"
    num_threads: int | None = None  # None: torch's default
    baselines: tuple[str, ...] = BASELINES
    warmup: int = 1
    repeats: int = 1
    seed: int = 0
    max_batch_prefill_tokens: int | None = None
    max_batch_size: int | None = None
    model_implementation: str = "auto"  # "transformers": pytgi runs the transformers fallback
    quantize: str | None = None  # pytgi's --quantize (the transformers baselines stay in dtype)
    quantize_activations: str | None = None  # None: the method's default activations
    sequential_sample: int = 4  # identical requests run one at a time before replaying; 0: all
    bandwidth_bytes: int = 1 << 30  # tensor summed to measure read bandwidth
    gemm_size: int = 2048  # square matrices multiplied to measure GEMM throughput


@dataclass
class CaseResult:
    workload: Workload
    roofline: MachineRoofline  # measured right before this workload's timed runs
    runs: dict[str, list[RunMetrics]] = field(default_factory=dict)  # system → one per repeat

    @property
    def summary(self) -> dict[str, RunMetrics]:
        return {system: median_metrics(runs) for system, runs in self.runs.items()}


@dataclass
class BenchResult:
    options: BenchOptions
    machine: dict
    footprint: ModelFootprint
    hf_attn_implementation: str | None
    cases: list[CaseResult] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    wall_s: float = 0.0


def run_suite(
    options: BenchOptions,
    log: Callable[[str], None] | None = None,
    *,
    omp_wait_policy: str | None = None,
) -> BenchResult:
    """Runs every workload of `options`; `log` gets one progress line per run (default: stderr).
    `omp_wait_policy` (the environment's OMP_WAIT_POLICY) is recorded with the machine.

    Both engines run with `options.num_threads` torch threads; the caller's setting is restored.
    """
    previous_threads = torch.get_num_threads()
    if options.num_threads is not None:
        torch.set_num_threads(options.num_threads)
    try:
        return _run_suite(options, log or _log_stderr, omp_wait_policy)
    finally:
        torch.set_num_threads(previous_threads)


def _run_suite(
    options: BenchOptions, log: Callable[[str], None], omp_wait_policy: str | None
) -> BenchResult:
    start_s = time.perf_counter()
    model_dir = _model_dir(options.model_id)
    footprint = model_footprint(model_dir, options.dtype)
    runners, hf_attn, device, close = _load_runners(options, model_dir)
    result = BenchResult(options, machine_info(device, omp_wait_policy), footprint, hf_attn)
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    try:
        for workload in options.workloads:
            case = _CaseRun(
                workload, _runners_for(workload, runners), options, vocab_size, log, device
            )
            case.warm_up()
            roofline = case.measure_roofline()
            runs = {
                name: [summarize(trace, footprint, roofline) for trace in traces]
                for name, traces in case.run_timed().items()
            }
            result.cases.append(CaseResult(workload, roofline, runs))
    finally:
        close()
    result.wall_s = time.perf_counter() - start_s
    return result


def _load_runners(options: BenchOptions, model_dir: Path):
    from pytgi.benchmark.engine.pytgi_runner import PytgiRunner, create_engine

    def engine(implementation: str):
        return create_engine(
            str(model_dir),
            options.dtype,
            torch.get_num_threads(),
            options.max_batch_prefill_tokens,
            options.max_batch_size,
            implementation,
            options.quantize,
            options.quantize_activations,
        )

    core = engine(options.model_implementation)
    _check_capacity(options, core.cache_info.max_total_tokens)
    cores = [core]
    device = core.cache_info.device  # the platform pytgi chose; the baseline runs there too
    runners: dict[str, Runner] = {"pytgi": PytgiRunner(core).run}
    hf_attn = None
    hf_baselines = [name for name in options.baselines if name.startswith("hf_")]
    if hf_baselines:
        from pytgi.benchmark.engine.hf_runner import HfRunner

        hf = HfRunner(model_dir, options.dtype, options.sequential_sample, device)
        hf_attn = hf.attn_implementation
        available = {"hf_sequential": hf.run_sequential, "hf_static": hf.run_static}
        runners.update({name: available[name] for name in hf_baselines})
    if FALLBACK_BASELINE in options.baselines:
        cores.append(engine("transformers"))
        runners[FALLBACK_BASELINE] = PytgiRunner(cores[-1], FALLBACK_BASELINE).run

    def close() -> None:
        for each in cores:
            each.shutdown()

    return runners, hf_attn, device, close


def _runners_for(workload: Workload, runners: dict[str, Runner]) -> dict[str, Runner]:
    if len(workload.requests) == 1:  # a static batch of one is the sequential run again
        return {name: runner for name, runner in runners.items() if name != "hf_static"}
    return runners


@dataclass
class _CaseRun:
    """One workload: warm-up, the roofline measured just before timing, then the timed rounds."""

    workload: Workload
    runners: dict[str, Runner]
    options: BenchOptions
    vocab_size: int
    log: Callable[[str], None]
    device: str = "cpu"

    def warm_up(self) -> None:
        warm = warmup_workload(self.workload)
        for index in range(self.options.warmup):
            prompts = random_prompts(
                warm, self.vocab_size, f"{self.options.seed}-{warm.name}-{index}"
            )
            for runner in self.runners.values():
                runner(warm, prompts)

    def measure_roofline(self) -> MachineRoofline:
        options = self.options
        roofline = measure_machine(
            options.bandwidth_bytes, options.gemm_size, self.device, options.dtype
        )
        where = "GPU" if self.device == "cuda" else f"{roofline.num_threads} torch threads"
        self.log(
            f"[{self.workload.name}] roofline on {where}: "
            f"{roofline.bandwidth_gb_s:.1f} GB/s, {roofline.gemm_gflop_s:.1f} GFLOP/s"
        )
        return roofline

    def run_timed(self) -> dict[str, list[RunTrace]]:
        name, seed, repeats = self.workload.name, self.options.seed, self.options.repeats
        traces: dict[str, list[RunTrace]] = {system: [] for system in self.runners}
        for repeat in range(repeats):
            prompts = random_prompts(self.workload, self.vocab_size, f"{seed}-{name}-{repeat}")
            for system, runner in self.runners.items():
                trace = runner(self.workload, prompts)
                trace.check_complete()
                traces[system].append(trace)
                self.log(
                    f"[{name}] repeat {repeat + 1}/{repeats} {system}: {trace.wall_s:.1f} s, "
                    f"{trace.num_output_tokens / trace.wall_s:.1f} output tok/s"
                )
        return traces


def ratios(case: CaseResult) -> dict[str, dict[str, float]]:
    """pytgi ÷ each baseline, per metric of RATIO_METRICS (throughput > 1 and TTFT < 1 are wins)."""
    summary = case.summary
    ours = summary["pytgi"]
    return {
        name: {m: _ratio(getattr(ours, m), getattr(theirs, m)) for m in RATIO_METRICS}
        for name, theirs in summary.items()
        if name != "pytgi"
    }


def target_verdicts(case: CaseResult) -> list[dict]:
    """The issue's goals for this workload: the value reached, and whether it meets the goal."""
    summary, verdicts = case.summary, []
    for target in case.workload.targets:
        if target.baseline == "roofline":
            value = summary["pytgi"].decode_bw_fraction
        elif target.baseline in summary:
            ours, theirs = summary["pytgi"], summary[target.baseline]
            value = _ratio(getattr(ours, target.metric), getattr(theirs, target.metric))
        else:
            continue
        verdicts.append(
            {
                "metric": target.metric,
                "baseline": target.baseline,
                "min_ratio": target.min_ratio,
                "value": value,
                "met": value >= target.min_ratio,
            }  # fmt: skip
        )
    return verdicts


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else float("nan")


def _check_capacity(options: BenchOptions, max_total_tokens: int) -> None:
    for workload in options.workloads:
        if workload.max_total_len > max_total_tokens:
            raise ValueError(
                f"workload {workload.name} needs {workload.max_total_len} tokens per request; "
                f"the engine allows {max_total_tokens}"
            )


def _model_dir(model_id: str) -> Path:
    """The checkpoint directory, or a GGUF file's prepared directory (models/gguf/prepared.py)."""
    from pytgi.models.resolve import resolve_model
    from pytgi.runtime.build import engine_config

    return resolve_model(engine_config(model_id).model)


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
