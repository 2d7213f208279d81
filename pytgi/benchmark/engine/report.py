"""Human-readable output: a fixed-width table for the terminal and a Markdown snippet for docs.

Both show, per workload, one row per system (the medians over repeats), the pytgi ÷ baseline
ratios and the issue's targets with their verdicts.
"""

from __future__ import annotations

import math

from pytgi.benchmark.engine.metrics import RunMetrics
from pytgi.benchmark.engine.suite import BenchResult, CaseResult, ratios, target_verdicts

# (header, RunMetrics field or None for a computed cell, format)
COLUMNS = (
    ("system", "system", "{}"),
    ("wall s", "wall_s", "{:.2f}"),
    ("prefill tok/s", "prefill_tok_s", "{:.1f}"),
    ("decode tok/s", "decode_tok_s", "{:.1f}"),
    ("output tok/s", "output_tok_s", "{:.1f}"),
    ("TTFT p50/p90/p99 ms", None, "ttft"),
    ("ITL p50/p90/p99 ms", None, "itl"),
    ("step ms", "decode_step_ms", "{:.1f}"),
    ("BW frac", "decode_bw_fraction", "{:.2f}"),
    ("FLOP frac", "prefill_flop_fraction", "{:.2f}"),
    ("others", "others", "{:.2f}"),
)


def text_report(result: BenchResult) -> str:
    lines = [_header(result)]
    for case in result.cases:
        lines += [
            "",
            f"== {case.workload.name}: {case.workload.description} ==",
            _roofline(result, case),
        ]
        rows = [_row(m) for m in case.summary.values()]
        lines += _fixed_width([[c[0] for c in COLUMNS], *rows])
        lines += _replay_lines(case) + _ratio_lines(case) + _target_lines(case)
        lines += _floor_lines(result, case)
    return "\n".join(lines) + "\n"


def markdown_report(result: BenchResult) -> str:
    lines = [_header(result).replace("\n", "  \n")]
    for case in result.cases:
        lines += ["", f"#### {case.workload.name}: {case.workload.description}", ""]
        lines += [_roofline(result, case), ""]
        lines.append("| " + " | ".join(c[0] for c in COLUMNS) + " |")
        lines.append("|" + "---|" * len(COLUMNS))
        lines += ["| " + " | ".join(_row(m)) + " |" for m in case.summary.values()]
        lines.append("")
        notes = _replay_lines(case) + _ratio_lines(case) + _target_lines(case)
        notes += _floor_lines(result, case)
        lines += [f"- {line}" for line in notes]
    return "\n".join(lines) + "\n"


def _header(result: BenchResult) -> str:
    m, f, o = result.machine, result.footprint, result.options
    return (
        f"model {o.model_id} ({f.num_params / 1e6:.3g} M params, {o.dtype}, "
        f"{f.decode_weight_bytes / 1e6:.3g} MB read per decode step)\n"
        f"machine {m['cpu_model']}, {m['num_cores']} cores, torch {m['torch_version']}, "
        f"torch threads {m['torch_num_threads']}\n"
        f"repeats {o.repeats}, warm-up {o.warmup}, seed {o.seed}, wall {result.wall_s:.0f} s"
    )


def _roofline(result: BenchResult, case: CaseResult) -> str:
    r, bytes_per_step = case.roofline, result.footprint.decode_weight_bytes
    others = _fmt("{:.2f}", math.nan if r.others is None else r.others)
    return (
        f"roofline measured before the runs: {r.bandwidth_gb_s:.1f} GB/s read, "
        f"{r.gemm_gflop_s:.1f} GFLOP/s fp32 GEMM (others {others}); "
        f"bound {bytes_per_step / (r.bandwidth_gb_s * 1e9) * 1e3:.3g} ms per decode step"
    )


def _row(metrics: RunMetrics) -> list[str]:
    cells = []
    for header, name, fmt in COLUMNS:
        if header == "system":
            cells.append(metrics.system + ("*" if metrics.num_replayed else ""))
            continue
        if fmt in ("ttft", "itl"):
            values = [getattr(metrics, f"{fmt}_p{p}_ms") for p in (50, 90, 99)]
            cells.append("/".join(_fmt("{:.0f}", v) for v in values))
        else:
            cells.append(_fmt(fmt, getattr(metrics, name)))
    return cells


def _fmt(fmt: str, value) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def _fixed_width(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in
                      enumerate(zip(row, widths, strict=True))) for row in rows]  # fmt: skip


def _replay_lines(case: CaseResult) -> list[str]:
    return [
        f"{m.system}*: {m.num_requests - m.num_replayed} of {m.num_requests} identical requests "
        "run, the rest timed as copies of them"
        for m in case.summary.values()
        if m.num_replayed
    ]


def _ratio_lines(case: CaseResult) -> list[str]:
    lines = []
    for baseline, values in ratios(case).items():
        lines.append(
            f"pytgi / {baseline}: output {values['output_tok_s']:.2f}x, "
            f"decode {values['decode_tok_s']:.2f}x, prefill {values['prefill_tok_s']:.2f}x, "
            f"TTFT p50 {values['ttft_p50_ms']:.2f}x (lower is better)"
        )
    return lines


def _target_lines(case: CaseResult) -> list[str]:
    lines = []
    for v in target_verdicts(case):
        goal = "of the bound" if v["baseline"] == "roofline" else f"x {v['baseline']}"
        verdict = "met" if v["met"] else "MISSED"
        lines.append(
            f"target {v['metric']} >= {v['min_ratio']:.2f} {goal}: {v['value']:.2f} ({verdict})"
        )
    return lines


def _floor_lines(result: BenchResult, case: CaseResult) -> list[str]:
    """The workload's matmul FLOPs at the measured GEMM rate: no engine on this machine and
    thread count finishes sooner, so baseline wall ÷ floor caps pytgi's output-rate ratio."""
    w = case.workload
    flop = result.footprint.workload_matmul_flop(w.num_prompt_tokens, w.num_output_tokens)
    floor_s = flop / (case.roofline.gemm_gflop_s * 1e9)
    caps = [
        f"{m.system} {m.wall_s / floor_s:.2f}x"
        for m in case.summary.values()
        if m.system != "pytgi" and floor_s > 0
    ]
    line = (
        f"compute floor: {flop / 1e12:.3g} TFLOP of matmuls = {floor_s:.1f} s "
        "at the measured GEMM rate"
    )
    return [line + (f"; highest reachable pytgi / baseline: {', '.join(caps)}" if caps else "")]
