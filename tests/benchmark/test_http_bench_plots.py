"""The distribution plots draw the percentiles their caption states (issue 13, item 8)."""

from __future__ import annotations

from matplotlib.lines import Line2D

from pytgi.benchmark.http import plots
from pytgi.benchmark.http.stats import percentile


def _step(ttfts: list[float]) -> dict:
    dist = {"p50": percentile(ttfts, 50), "p90": percentile(ttfts, 90)}
    requests = [{"error": None, "ttft_ms": t, "itl_ms": []} for t in ttfts]
    return {"num_succeeded": len(ttfts), "load": 16, "label": "c=16", "requests": requests,
            "output_token_throughput": 100.0, "ttft_ms": dist, "itl_ms": None}  # fmt: skip


def test_whiskers_are_p1_and_p99_not_the_last_sample_inside(tmp_path, monkeypatch):
    # 16 requests with one slow outlier: p99 (interpolated, as in the results table) is far above
    # the second-slowest sample, where matplotlib's own whiskers would stop
    ttfts = [100.0 + i for i in range(15)] + [2000.0]
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append((path.name, fig)))
    plots.write_plots({"steps": [_step(ttfts)], "slo": {}}, tmp_path)
    fig = dict(figures)["ttft_distribution.png"]
    drawn = [y for line in fig.axes[0].get_lines() if isinstance(line, Line2D)
             for y in line.get_ydata()]  # fmt: skip
    assert max(drawn) == percentile(ttfts, 99) > 1700
    assert min(drawn) == percentile(ttfts, 1)
