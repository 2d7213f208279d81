"""PNG plots of a results file, drawn with matplotlib's Agg canvas (no display, no pyplot state).

- throughput_latency.png: TTFT and inter-token latency (p50 and p90) against output tokens/s,
  one point per step, labelled with its load; the SLO as a dashed line.
- ttft_distribution.png, itl_distribution.png: one box per step (box p25–p75, whiskers p1–p99,
  median line, p90 diamond), steps ordered by load. Every mark is the percentile of the results
  table (`stats.percentile`), not matplotlib's whiskers, which stop at the last sample inside
  the range (with few samples, far from the p99 the caption names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pytgi.benchmark.http.stats import percentile

P50_COLOR, P90_COLOR, SLO_COLOR = "#1f77b4", "#d62728", "#555555"
BOX_COLOR, MEDIAN_COLOR = "#9ecae1", "#08306b"
DPI = 120


def write_plots(data: dict[str, Any], out_dir: Path) -> list[str]:
    """Draws every plot the data allows; returns the file names written."""
    steps = sorted((s for s in data["steps"] if s["num_succeeded"]), key=lambda s: s["load"])
    if not steps:
        return []
    slo = data.get("slo") or {}
    written = [_throughput_latency(steps, slo, out_dir / "throughput_latency.png")]
    for metric, title, file_name in (
        ("ttft", "Time to first token", "ttft_distribution.png"),
        ("itl", "Inter-token latency", "itl_distribution.png"),
    ):
        samples = [_samples(step, metric) for step in steps]
        if any(samples):
            limit = slo.get(f"{metric}_ms")
            _distribution(steps, samples, title, limit, slo, out_dir / file_name)
            written.append(file_name)
    return written


def _samples(step: dict[str, Any], metric: str) -> list[float]:
    ok = [r for r in step["requests"] if r["error"] is None]
    if metric == "ttft":
        return [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]
    return [gap for r in ok for gap in r["itl_ms"]]


def _throughput_latency(steps: list[dict[str, Any]], slo: dict[str, Any], path: Path) -> str:
    fig = Figure(figsize=(11, 4.8))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.11, top=0.8, wspace=0.18)
    axes = fig.subplots(1, 2)
    for ax, metric, title in zip(
        axes, ("ttft", "itl"), ("Time to first token", "Inter-token latency"), strict=True
    ):
        _latency_panel(ax, steps, metric, slo)
        ax.set_title(title)
    fig.suptitle("Throughput against latency (one point per step)", fontsize=13)
    handles: dict[str, Any] = {}  # one legend for both panels (an SLO may apply to only one)
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.legend(
        handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0.93), ncol=3
    )
    _save(fig, path)
    return path.name


def _latency_panel(ax, steps: list[dict[str, Any]], metric: str, slo: dict[str, Any]) -> None:
    key = f"{metric}_ms"
    points = [(s["output_token_throughput"], s[key], s["label"]) for s in steps if s[key]]
    for pct, color in (("p50", P50_COLOR), ("p90", P90_COLOR)):
        if points:
            xs, ys = [x for x, _, _ in points], [dist[pct] for _, dist, _ in points]
            ax.plot(xs, ys, "o-", color=color, label=pct, lw=2, ms=6)
    for x, dist, label in points:
        ax.annotate(label, (x, dist["p90"]), textcoords="offset points", xytext=(0, 9),
                    ha="center", fontsize=9, color="#333333")  # fmt: skip
    limit = slo.get(key)
    if limit is not None:
        ax.axhline(limit, ls="--", color=SLO_COLOR, label=f"SLO: p{slo['percentile']} objective")
    ax.set(xlabel="output tokens / s", ylabel="ms")
    ax.margins(x=0.12, y=0.18)
    _y_range_with(ax, limit)
    ax.grid(alpha=0.3)


def _distribution(steps, samples, title: str, limit, slo: dict[str, Any], path: Path) -> None:
    width = max(6.5, 1.1 * len(steps) + 2)
    fig = Figure(figsize=(width, 4.6))
    fig.subplots_adjust(left=0.8 / width, right=1 - 0.2 / width, bottom=0.22, top=0.9)
    ax = fig.subplots()
    positions = [i for i, values in enumerate(samples, 1) if values]
    data = [values for values in samples if values]
    ax.bxp([box_stats(values) for values in data], positions=positions, showfliers=False,
           widths=0.55, patch_artist=True,
           boxprops={"facecolor": BOX_COLOR, "edgecolor": "#333333"},
           medianprops={"color": MEDIAN_COLOR, "lw": 2})  # fmt: skip
    p90 = [percentile(values, 90) for values in data]
    ax.plot([], [], color=MEDIAN_COLOR, lw=2, label="median")
    ax.plot(positions, p90, "D", color=P90_COLOR, ms=6, label="p90")
    if limit is not None:
        ax.axhline(
            limit, ls="--", color=SLO_COLOR, label=f"SLO p{slo['percentile']} ≤ {limit:g} ms"
        )
    ax.set_xticks(range(1, len(steps) + 1), [s["label"] for s in steps])
    ax.set(title=f"{title} per step (box p25–p75, whiskers p1–p99)", ylabel="ms", xlabel="load")
    ax.margins(y=0.08)
    _y_range_with(ax, limit)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)
    _save(fig, path)


def box_stats(values: list[float]) -> dict[str, Any]:
    """A box at p25–p75 with whiskers at p1 and p99, as the plot's caption states."""
    return {
        "med": percentile(values, 50),
        "q1": percentile(values, 25),
        "q3": percentile(values, 75),
        "whislo": percentile(values, 1),
        "whishi": percentile(values, 99),
        "fliers": [],
    }


def _y_range_with(ax, limit: float | None) -> None:
    """From 0 up to the data, and past the SLO line (axhline does not autoscale)."""
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top if limit is None else max(top, limit * 1.1))


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
