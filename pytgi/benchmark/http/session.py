"""One benchmark run from validated options to files on disk.

`run_bench` opens a target (the HTTP server, or any other `RequestSender` a caller supplies: this
is the hook the engine benchmark uses), runs the sweep, and returns a `BenchRun`;
`write_outputs` writes results.json, report.md and the PNG plots into the output directory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytgi.benchmark.http.apis import ApiOptions, make_api
from pytgi.benchmark.http.client import HttpSender, discover_model_name
from pytgi.benchmark.http.options import BenchOptions
from pytgi.benchmark.http.progress import NoProgress, TqdmProgress
from pytgi.benchmark.http.records import RequestSender
from pytgi.benchmark.http.report import write_markdown
from pytgi.benchmark.http.results import BenchRun, write_results
from pytgi.benchmark.http.sweep import SpecSource, SweepRunner

# Opens a target inside the event loop: returns its sender and a description for the report
# (keys: url, api, model, and anything else worth recording).
TargetOpener = Callable[[BenchOptions], Awaitable[tuple[RequestSender, dict[str, Any]]]]


async def open_http_target(options: BenchOptions) -> tuple[RequestSender, dict[str, Any]]:
    model = options.model or await discover_model_name(options.url, options.api_key, options.api)
    api = make_api(options.api, ApiOptions(model or "tgi", options.temperature, options.ignore_eos))
    max_connections = max(options.limits.max_concurrency, *_concurrency_levels(options))
    sender = HttpSender(
        options.url, api, options.request_timeout_s, max_connections, options.api_key
    )
    return sender, {"url": sender.base_url, "api": options.api, "model": model}


def _concurrency_levels(options: BenchOptions) -> list[int]:
    return [int(v) for v in options.plan.levels] if options.plan.mode == "concurrency" else [1]


async def run_bench(
    options: BenchOptions, workload: SpecSource, open_target: TargetOpener
) -> BenchRun:
    """Runs the sweep. Ctrl-C ends it early and keeps the steps that completed."""
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.perf_counter()
    sender, target = await open_target(options)
    target["tokenizer"] = options.tokenizer_name
    progress = TqdmProgress() if options.progress else NoProgress()
    runner = SweepRunner(sender, workload, options.limits, options.slo, progress)
    try:
        outcome = await runner.run(options.plan)
    except asyncio.CancelledError:
        outcome = runner.outcome("interrupted; the steps that completed are kept")
        outcome.interrupted = True
    finally:
        await sender.aclose()
    name = options.name or f"{target.get('api')} @ {_host(target.get('url'))}"
    settings = options.settings()
    return BenchRun(
        name, started_at, time.perf_counter() - t0, target, settings, options.slo, outcome
    )


def _host(url: str | None) -> str:
    return urlsplit(url).netloc if url else "in-process"


def write_outputs(run: BenchRun, out_dir: Path, plots: bool = True) -> dict[str, Path]:
    """Writes results.json, report.md and (if `plots`) the PNGs; returns the paths by kind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = run.to_dict()
    paths = {"results": write_results(data, out_dir / "results.json")}
    plot_files = []
    if plots:
        from pytgi.benchmark.http.plots import write_plots  # matplotlib: imported only when used

        plot_files = write_plots(data, out_dir)
    paths["report"] = write_markdown(data, out_dir / "report.md", plot_files)
    paths |= {name.removesuffix(".png"): out_dir / name for name in plot_files}
    return paths
