"""From a `RunTrace` to the reported numbers, and the median over repeats.

Throughputs count useful tokens only (what each request asked for), so a static batch that pads a
short request up to the longest output gets no credit for the padding. Latencies are milliseconds:
TTFT from the run's start (all requests arrive together), per-token latency between consecutive
tokens of one request, pooled over requests.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields

from pytgi.benchmark.engine.roofline import MachineRoofline, ModelFootprint
from pytgi.benchmark.engine.trace import RunTrace

PERCENTILES = (50, 90, 99)


@dataclass
class RunMetrics:
    system: str
    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    wall_s: float
    prefill_tok_s: float
    decode_tok_s: float
    output_tok_s: float  # useful output tokens / wall time: the headline
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float
    decode_step_ms: float  # median decode step
    decode_bw_fraction: float  # (decode weight bytes / decode step) ÷ measured bandwidth
    prefill_flop_fraction: float  # (matmul FLOP/token × prefill tok/s) ÷ measured GEMM FLOP/s
    num_preemptions: int
    num_replayed: int  # requests timed as copies of identical measured ones
    others: float  # contention; NaN when unknown


def percentile(values: Sequence[float], pct: float) -> float:
    """Linear interpolation between the closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(trace: RunTrace, footprint: ModelFootprint, machine: MachineRoofline) -> RunMetrics:
    ttfts_ms = [r.ttft_s * 1e3 for r in trace.requests if r.token_times_s]
    itls_ms = [gap * 1e3 for r in trace.requests for gap in r.inter_token_s()]
    step_s = statistics.median(trace.decode_step_s) if trace.decode_step_s else math.nan
    prefill_tok_s = _rate(trace.num_prefill_tokens, trace.prefill_time_s)
    ttft = {p: percentile(ttfts_ms, p) for p in PERCENTILES}
    itl = {p: percentile(itls_ms, p) for p in PERCENTILES}
    return RunMetrics(
        system=trace.system,
        num_requests=len(trace.requests),
        num_prompt_tokens=sum(r.prompt_len for r in trace.requests),
        num_output_tokens=trace.num_output_tokens,
        wall_s=trace.wall_s,
        prefill_tok_s=prefill_tok_s,
        decode_tok_s=_rate(trace.num_decode_tokens, trace.decode_time_s),
        output_tok_s=_rate(trace.num_output_tokens, trace.wall_s),
        ttft_p50_ms=ttft[50],
        ttft_p90_ms=ttft[90],
        ttft_p99_ms=ttft[99],
        itl_p50_ms=itl[50],
        itl_p90_ms=itl[90],
        itl_p99_ms=itl[99],
        decode_step_ms=step_s * 1e3,
        decode_bw_fraction=footprint.decode_weight_bytes / step_s / (machine.bandwidth_gb_s * 1e9),
        prefill_flop_fraction=footprint.prefill_flop_per_token
        * prefill_tok_s
        / (machine.gemm_gflop_s * 1e9),
        num_preemptions=trace.num_preemptions,
        num_replayed=trace.num_replayed,
        others=math.nan if trace.others is None else trace.others,
    )


def median_metrics(runs: Sequence[RunMetrics]) -> RunMetrics:
    """Field-wise median over repeats of the same system and workload."""
    if len(runs) == 1:
        return runs[0]
    values = {}
    for f in fields(RunMetrics):
        column = [getattr(run, f.name) for run in runs]
        values[f.name] = column[0] if isinstance(column[0], str) else _median(column)
    return RunMetrics(**values)


def _median(column: list) -> float | int:
    finite = [v for v in column if not (isinstance(v, float) and math.isnan(v))]
    if not finite:
        return math.nan
    value = statistics.median(finite)
    return round(value) if isinstance(column[0], int) else value


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else math.nan
