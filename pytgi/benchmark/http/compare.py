"""`pytgi bench compare A.json B.json`: two runs side by side, with the ratio B/A per metric.

Steps are matched by load level (same mode and value); for each matched step a table lists the
metric in A and B, the ratio, and which run is better (latencies and error rate: lower is better;
throughputs and the SLO-meeting load: higher is better; within 2% counts as a tie).
"""

from __future__ import annotations

from typing import Any

from pytgi.benchmark.http.report import slo_text

TIE_TOLERANCE = 0.02
# (label, key, percentile or None, higher is better)
METRICS = (
    ("requests / s", "request_throughput", None, True),
    ("output tokens / s", "output_token_throughput", None, True),
    ("TTFT p50 (ms)", "ttft_ms", "p50", False),
    ("TTFT p90 (ms)", "ttft_ms", "p90", False),
    ("TTFT p99 (ms)", "ttft_ms", "p99", False),
    ("ITL p50 (ms)", "itl_ms", "p50", False),
    ("ITL p90 (ms)", "itl_ms", "p90", False),
    ("ITL p99 (ms)", "itl_ms", "p99", False),
    ("E2E p50 (ms)", "e2e_ms", "p50", False),
    ("E2E p90 (ms)", "e2e_ms", "p90", False),
    ("error rate", "error_rate", None, False),
)


def compare_markdown(a: dict[str, Any], b: dict[str, Any], a_path: str, b_path: str) -> str:
    lines = [f"# Compare: A = {a['name']} · B = {b['name']}", ""]
    lines += [f"- **A**: `{a_path}` ({_target(a)})", f"- **B**: `{b_path}` ({_target(b)})", ""]
    lines += _best_load_lines(a, b)
    a_steps, b_steps = _by_load(a), _by_load(b)
    for key in sorted(a_steps.keys() & b_steps.keys()):
        lines += [f"## {a_steps[key]['label']}", "", "| metric | A | B | B/A | better |"]
        lines.append("|---|---:|---:|---:|:---:|")
        lines += [_metric_row(metric, a_steps[key], b_steps[key]) for metric in METRICS]
        lines.append("")
    for side, only in (
        ("A", a_steps.keys() - b_steps.keys()),
        ("B", b_steps.keys() - a_steps.keys()),
    ):
        if only:
            labels = ", ".join(a_steps.get(k, b_steps.get(k))["label"] for k in sorted(only))
            lines += [f"Only in {side} (not compared): {labels}", ""]
    if not a_steps.keys() & b_steps.keys():
        lines += ["No load level appears in both runs; run both with the same sweep.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _target(data: dict[str, Any]) -> str:
    t = data["target"]
    return f"{t.get('url')}, API {t.get('api')}, model {t.get('model')}, {data['started_at']}"


def _by_load(data: dict[str, Any]) -> dict[tuple[str, float], dict[str, Any]]:
    return {(step["mode"], float(step["load"])): step for step in data["steps"]}


def _best_load_lines(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    if not (a.get("slo") and b.get("slo")):
        return []
    lines = [f"SLO: A {slo_text(a['slo'])}; B {slo_text(b['slo'])}.", ""]
    row = _ratio_cells(a.get("best_load"), b.get("best_load"), higher_is_better=True)
    lines += ["| | A | B | B/A | better |", "|---|---:|---:|---:|:---:|"]
    lines += [f"| highest load meeting the SLO | {' | '.join(row)} |", ""]
    return lines


def _metric_row(metric: tuple, a_step: dict[str, Any], b_step: dict[str, Any]) -> str:
    label, key, pct, higher_is_better = metric
    cells = _ratio_cells(_value(a_step, key, pct), _value(b_step, key, pct), higher_is_better)
    return f"| {label} | {' | '.join(cells)} |"


def _value(step: dict[str, Any], key: str, pct: str | None) -> float | None:
    value = step.get(key)
    if pct is not None:
        return value[pct] if value else None
    return value


def _ratio_cells(a: float | None, b: float | None, higher_is_better: bool) -> list[str]:
    """[A, B, B/A, better]"""
    if a is None or b is None:
        return [_fmt(a), _fmt(b), "–", "–"]
    if a == b:
        return [_fmt(a), _fmt(b), "1.00×" if a else "–", "="]
    ratio = b / a if a else float("inf")
    if abs(ratio - 1.0) <= TIE_TOLERANCE:
        better = "="
    else:
        better = "B" if (ratio > 1.0) == higher_is_better else "A"
    return [_fmt(a), _fmt(b), f"{ratio:.2f}×", better]


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
