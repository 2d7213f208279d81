"""PNG plots of a results file, drawn with matplotlib's Agg canvas (no display, no pyplot state).

- throughput_latency.png: TTFT and inter-token latency (p50 and p90) against output tokens/s,
  one point per step, labelled with its load; the SLO as a dashed line.
- ttft_distribution.png, itl_distribution.png: one box per step (box p25–p75, whiskers p1–p99,
  median line, p90 diamond), steps ordered by load.
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
    fig = Figure(figsize=(11, 4.6), layout="constrained")
    throughput = [s["output_token_throughput"] for s in steps]
    for ax, metric, title in zip(
        fig.subplots(1, 2),
        ("ttft_ms", "itl_ms"),
        ("Time to first token", "Inter-token latency"),
        strict=True,
    ):
        for pct, color in (("p50", P50_COLOR), ("p90", P90_COLOR)):
            points = [
                (x, s[metric][pct]) for x, s in zip(throughput, steps, strict=True) if s[metric]
            ]
            if points:
                ax.plot(*zip(*points, strict=True), "o-", color=color, label=pct, lw=2, ms=6)
        for x, step in zip(throughput, steps, strict=True):
            if step[metric]:
                ax.annotate(step["label"], (x, step[metric]["p90"]), textcoords="offset points",
                            xytext=(-6, 8), fontsize=9, color="#333333", ha="right")  # fmt: skip
        _slo_line(ax, slo, metric.removesuffix("_ms"))
        ax.set(title=title, xlabel="output tokens / s", ylabel="ms")
        ax.margins(x=0.1, y=0.15)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle("Throughput against latency (one point per step)", fontsize=12)
    _save(fig, path)
    return path.name


def _distribution(steps, samples, title: str, limit, slo: dict[str, Any], path: Path) -> None:
    fig = Figure(figsize=(max(6.0, 1.1 * len(steps) + 2), 4.6), layout="constrained")
    ax = fig.subplots()
    positions = [i for i, values in enumerate(samples, 1) if values]
    data = [values for values in samples if values]
    ax.boxplot(data, positions=positions, whis=(1, 99), showfliers=False, widths=0.55,
               patch_artist=True, boxprops={"facecolor": BOX_COLOR, "edgecolor": "#333333"},
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
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left")
    _save(fig, path)


def _slo_line(ax, slo: dict[str, Any], metric: str) -> None:
    limit = slo.get(f"{metric}_ms")
    if limit is not None:
        ax.axhline(limit, ls="--", color=SLO_COLOR, label=f"SLO p{slo['percentile']}")


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
