"""The Markdown report (and the console summary) of one results file.

The report leads with the answer (the highest load meeting the SLO, or why the run stopped),
then one row per step, the errors, the plots and the settings that produced the numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

STEP_COLUMNS = (
    "load", "sent", "ok", "failed", "err %", "req/s", "out tok/s", "tok/req",
    "TTFT p50", "TTFT p90", "TTFT p99", "ITL p50", "ITL p90", "ITL p99", "E2E p50", "E2E p90",
)  # fmt: skip
PLOTS = (
    ("throughput_latency.png", "Throughput against latency"),
    ("ttft_distribution.png", "Time to first token per step"),
    ("itl_distribution.png", "Inter-token latency per step"),
)


def render_markdown(data: dict[str, Any], plot_files: list[str] | None = None) -> str:
    lines = [f"# pytgi bench: {data['name']}", "", _target_line(data), ""]
    lines += ["## Result", ""]
    for line in headline(data):
        lines += [line, ""]
    lines += ["## Steps", "", "Latencies in ms.", "", *steps_table(data["steps"]), ""]
    lines += _errors_section(data["steps"])
    if plot_files:
        lines += ["## Plots", ""]
        titles = dict(PLOTS)
        lines += [f"![{titles.get(name, name)}]({name})\n" for name in plot_files]
    lines += ["## Settings", "", "| setting | value |", "|---|---|"]
    lines += [f"| {key} | `{value}` |" for key, value in _flatten(data["settings"]).items()]
    return "\n".join(lines) + "\n"


def _target_line(data: dict[str, Any]) -> str:
    t = data["target"]
    parts = [f"`{t.get('url')}`", f"API `{t.get('api')}`", f"model `{t.get('model')}`"]
    parts += [f"tokenizer `{t.get('tokenizer')}`", f"started {data['started_at']}"]
    return " · ".join(parts) + f" · {len(data['steps'])} steps in {data['wall_time_s']:.1f} s"


def headline(data: dict[str, Any]) -> list[str]:
    """The run's answer, in one or two lines."""
    lines = []
    if data.get("stop_reason"):
        lines.append(f"**Stopped early:** {data['stop_reason']}")
    slo = data.get("slo")
    if slo:
        objective = slo_text(slo)
        if data.get("best_load") is None:
            lines.append(f"**No load level met the SLO** ({objective}).")
        else:
            best = _load_label(data.get("load_mode"), data["best_load"])
            lines.append(f"**Highest load meeting the SLO** ({objective}): **{best}**")
    peak = max(data["steps"], key=lambda s: s["output_token_throughput"], default=None)
    if peak is not None and peak["num_succeeded"]:
        lines.append(
            f"Peak throughput: **{peak['output_token_throughput']:.1f} output tokens/s**, "
            f"{peak['request_throughput']:.2f} req/s at {peak['label']}."
        )
    return lines or ["No request was sent."]


def slo_text(slo: dict[str, Any]) -> str:
    pct = slo["percentile"]
    parts = [f"TTFT p{pct} ≤ {slo['ttft_ms']:g} ms"] if slo.get("ttft_ms") is not None else []
    if slo.get("itl_ms") is not None:
        parts.append(f"ITL p{pct} ≤ {slo['itl_ms']:g} ms")
    parts.append(f"errors ≤ {slo['max_error_rate']:.1%}")
    return ", ".join(parts)


def steps_table(steps: list[dict[str, Any]]) -> list[str]:
    with_slo = any(s.get("meets_slo") is not None for s in steps)
    columns = STEP_COLUMNS + (("SLO",) if with_slo else ())
    rows = [_row(columns), _row(("---",) * len(columns))]
    for step in sorted(steps, key=lambda s: s["load"]):
        rows.append(_row(_step_cells(step, with_slo)))
    return rows


def _step_cells(step: dict[str, Any], with_slo: bool) -> list[str]:
    cells = [step["label"], str(step["num_sent"]), str(step["num_succeeded"])]
    cells += [str(step["num_failed"]), f"{100 * step['error_rate']:.1f}"]
    cells += [f"{step['request_throughput']:.2f}", f"{step['output_token_throughput']:.1f}"]
    tokens = step.get("output_tokens")
    cells.append(f"{tokens['mean']:.1f}" if tokens else "–")
    for metric, pcts in (("ttft_ms", (50, 90, 99)), ("itl_ms", (50, 90, 99)), ("e2e_ms", (50, 90))):
        dist = step.get(metric)
        cells += [f"{dist[f'p{p}']:.1f}" if dist else "–" for p in pcts]
    if with_slo:
        cells.append("✅" if step["meets_slo"] else "❌ " + "; ".join(step["slo_violations"] or []))
    return cells


def _errors_section(steps: list[dict[str, Any]]) -> list[str]:
    rows = [(s["label"], n, msg) for s in steps for msg, n in s["errors"].items()]
    if not rows:
        return []
    lines = ["## Errors", "", "| load | count | error |", "|---|---|---|"]
    lines += [f"| {label} | {n} | {_cell(msg)} |" for label, n, msg in rows]
    return [*lines, ""]


def _load_label(mode: str | None, load: float) -> str:
    return f"concurrency {load:g}" if mode == "concurrency" else f"{load:g} req/s"


def _flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def write_markdown(data: dict[str, Any], path: Path, plot_files: list[str]) -> Path:
    path.write_text(render_markdown(data, plot_files), encoding="utf-8")
    return path
