"""`pytgi bench --url ...` (HTTP load test) and `pytgi bench compare A.json B.json`.

`pytgi/cli/main.py` wires these in: `add_http_bench_args` / `run_http_bench` for `--url`,
`add_compare_args` / `run_compare` for `compare`. `run_load_bench(args, open_target)` is the hook
for other targets (the engine benchmark passes an opener for its in-process sender). Also
runnable alone: `python -m pytgi.benchmark.http_cli --url ... --tokenizer-name ...`.
Exit codes: 0 the run finished and requests succeeded, 1 no request succeeded, 2 bad settings,
130 interrupted (the steps that completed are still written).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytgi.benchmark.http.apis import API_NAMES
from pytgi.benchmark.http.client import ServerLimits, discover_server_limits
from pytgi.benchmark.http.compare import compare_markdown
from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.options import SLO_PERCENTILES, BenchOptions
from pytgi.benchmark.http.report import headline, steps_table
from pytgi.benchmark.http.results import BenchRun, read_results
from pytgi.benchmark.http.session import TargetOpener, open_http_target, run_bench, write_outputs
from pytgi.benchmark.http.tokenizer import load_tokenizer
from pytgi.benchmark.http.workload import PROFILES, Workload


@dataclass(frozen=True)
class Flag:
    name: str
    help: str
    type: Any = str  # None: an on/off switch
    default: Any = None
    choices: tuple | None = None
    metavar: str | None = None


PROFILE_HELP = "; ".join(f"{p.name}: {p.summary}" for p in PROFILES.values())
FLAG_GROUPS: dict[str, tuple[Flag, ...]] = {
    "target": (
        Flag("--url", "base URL of a TGI- or OpenAI-compatible server (pytgi, TGI, vLLM, "
             "llama.cpp), e.g. http://127.0.0.1:8080; the only address the benchmark talks to"),
        Flag("--api", "tgi: POST /generate_stream; chat: /v1/chat/completions; completions: "
             "/v1/completions", default="tgi", choices=API_NAMES),
        Flag("--model", "`model` field for the OpenAI routes (default: the first id of "
             "GET /v1/models, else 'tgi')", metavar="NAME"),
        Flag("--api-key", "sent as `Authorization: Bearer KEY`", metavar="KEY"),
    ),
    "workload": (
        Flag("--tokenizer-name", "tokenizer used to build prompts of exact token lengths: a "
             "tokenizer.json, a model directory, or a hub id (read from the local cache first)",
             metavar="NAME"),
        Flag("--tokenizer-revision", "hub revision of --tokenizer-name", metavar="REV"),
        Flag("--profile", f"prompt/output length profile ({PROFILE_HELP})", default="chat",
             choices=tuple(PROFILES)),
        Flag("--prompt-tokens", "prompt length distribution, overriding the profile: N, "
             "uniform:LO,HI, normal:MEAN,STD[,MIN,MAX] or lognormal:MEDIAN,SIGMA[,MIN,MAX]",
             metavar="SPEC"),
        Flag("--output-tokens", "output length distribution (max_new_tokens), same syntax",
             metavar="SPEC"),
        Flag("--prompts-file", "prompts to send instead of synthetic ones: .jsonl with "
             "{\"prompt\", \"output_tokens\"?} per line, or plain text with one per line",
             metavar="PATH"),
        Flag("--temperature", "sample at this temperature (default: greedy)", type=float,
             metavar="T"),
        Flag("--ignore-eos", "ask the server to ignore EOS (vLLM, llama.cpp; OpenAI routes)",
             type=None),
        Flag("--seed", "seed of prompts, lengths and arrival times", type=int, default=0,
             metavar="N"),
    ),
    "load": (
        Flag("--concurrency", "sweep these concurrency levels, e.g. 1,2,4,8 (default: 1)",
             metavar="LIST"),
        Flag("--rates", "sweep these Poisson request rates (req/s), e.g. 0.5,1,2",
             metavar="LIST"),
        Flag("--find-max-rate", "search the highest rate meeting the SLO (doubling from "
             "--rate-min, then bisection)", type=None),
        Flag("--rate-min", "first rate of the search (req/s)", type=float, default=0.5,
             metavar="RATE"),
        Flag("--rate-max", "highest rate the search tries (req/s)", type=float, default=64.0,
             metavar="RATE"),
        Flag("--bisections", "bisection steps after the doubling phase", type=int, default=3,
             metavar="N"),
    ),
    "bounds (per step)": (
        Flag("--duration", "seconds of measured load per step", type=float, default=30.0,
             metavar="S"),
        Flag("--max-requests", "measured requests per step at most", type=int, default=200,
             metavar="N"),
        Flag("--warmup-requests", "requests sent first and not measured (default: one per "
             "concurrency slot, or one second of arrivals)", type=int, metavar="N"),
        Flag("--max-concurrency", "cap on requests in flight at a rate", type=int, default=256,
             metavar="N"),
        Flag("--request-timeout", "seconds before one request counts as failed", type=float,
             default=120.0, metavar="S"),
        Flag("--abort-after-failures", "end a step after this many failures with no success",
             type=int, default=10, metavar="N"),
    ),
    "objective (SLO)": (
        Flag("--slo-ttft-ms", "time-to-first-token objective (ms)", type=float, metavar="MS"),
        Flag("--slo-itl-ms", "inter-token latency objective (ms)", type=float, metavar="MS"),
        Flag("--slo-percentile", "percentile the objectives apply to", type=int, default=90,
             choices=SLO_PERCENTILES),
        Flag("--slo-max-error-rate", "error rate a step may have and still meet the SLO",
             type=float, default=0.01, metavar="FRACTION"),
    ),
    "output": (
        Flag("--output-dir", "where results.json, report.md and the plots go (default: "
             "bench-results/<time>)", metavar="DIR"),
        Flag("--name", "label of this run in reports and comparisons", metavar="LABEL"),
        Flag("--no-progress", "no live progress bar", type=None),
        Flag("--no-plots", "skip the PNG plots (results.json and report.md only)", type=None),
    ),
}  # fmt: skip


def declared_flags() -> frozenset[str]:
    """The flag names `add_http_bench_args` declares (each with argparse's default dest)."""
    return frozenset(flag.name for flags in FLAG_GROUPS.values() for flag in flags)


def add_http_bench_args(parser: argparse.ArgumentParser) -> None:
    """Declare the `pytgi bench` flags (`--url` is optional here: `--model-id` is the other way)."""
    for title, flags in FLAG_GROUPS.items():
        group = parser.add_argument_group(title)
        for flag in flags:
            if flag.type is None:
                group.add_argument(flag.name, action="store_true", help=flag.help)
                continue
            group.add_argument(
                flag.name,
                type=flag.type,
                default=flag.default,
                choices=flag.choices,
                metavar=flag.metavar,
                help=flag.help
                + (f" (default: {flag.default})" if flag.default is not None else ""),
            )


def run_http_bench(args: argparse.Namespace) -> int:
    """`pytgi bench --url ...`; returns the exit code. A TGI-style server's `/info` limits bound
    every request's prompt and `max_new_tokens` (so none is refused for its length)."""
    if not args.url:
        return _fail("--url is required (or --model-id for the engine benchmark)")
    limits = asyncio.run(discover_server_limits(args.url, getattr(args, "api_key", None)))
    if limits is not None:
        print(
            f"pytgi bench: the server's /info limits (max_input_tokens={limits.max_input_tokens},"
            f" max_total_tokens={limits.max_total_tokens}) bound every request",
            file=sys.stderr,
        )
    return run_load_bench(args, open_http_target, limits)


def run_load_bench(
    args: argparse.Namespace, open_target: TargetOpener, limits: ServerLimits | None = None
) -> int:
    """Run the sweep against the target `open_target` opens; prints a summary, writes reports."""
    if args.output_dir is None:
        args.output_dir = str(Path("bench-results") / time.strftime("%Y%m%d-%H%M%S"))
    try:
        options = BenchOptions.from_args(args)
        tokenizer = load_tokenizer(
            options.tokenizer_name, options.tokenizer_revision, getattr(args, "cache_dir", None)
        )
        workload = Workload(options.workload, tokenizer, limits)
    except BenchConfigError as exc:
        return _fail(str(exc))
    run = asyncio.run(run_bench(options, workload, open_target))
    paths = write_outputs(run, options.output_dir, plots=options.plots)
    _print_summary(run, paths)
    if run.outcome.interrupted:
        return 130
    succeeded = sum(step.summary.num_succeeded for step in run.outcome.steps)
    return 0 if succeeded else 1


def _print_summary(run: BenchRun, paths: dict[str, Path]) -> None:
    data = run.to_dict()
    print(f"\npytgi bench: {run.name}\n")
    print("\n".join(headline(data)) + "\n")
    if data["steps"]:
        print("\n".join(steps_table(data["steps"])) + "\n")
    print("\n".join(f"{kind:>18}: {path}" for kind, path in paths.items()))


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A.json", help="baseline results file")
    parser.add_argument("b", metavar="B.json", help="results file compared to the baseline")
    parser.add_argument("--output", metavar="PATH", help="also write the comparison (Markdown)")


def run_compare(args: argparse.Namespace) -> int:
    """`pytgi bench compare A.json B.json`: prints (and optionally writes) the comparison."""
    try:
        a, b = read_results(args.a), read_results(args.b)
    except BenchConfigError as exc:
        return _fail(str(exc))
    text = compare_markdown(a, b, args.a, args.b)
    print(text, end="")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    return 0


def _fail(message: str) -> int:
    print(f"pytgi bench: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(
            prog="pytgi bench compare", description=run_compare.__doc__
        )
        add_compare_args(parser)
        return run_compare(parser.parse_args(argv[1:]))
    parser = argparse.ArgumentParser(
        prog="pytgi bench", description="Load-test a TGI- or OpenAI-compatible server."
    )
    add_http_bench_args(parser)
    return run_http_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
