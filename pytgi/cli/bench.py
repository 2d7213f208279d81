"""`pytgi bench`: one subcommand, two benchmarks, plus `pytgi bench compare A.json B.json`.

`--url URL` load-tests a running server over HTTP (pytgi.benchmark.http_cli); `--model-id ID`
drives the engine in this process and compares it with transformers `generate`
(pytgi.benchmark.engine). The HTTP benchmark's flags are declared first; the engine's are added
after them, reusing any option the HTTP side already declares.
"""

from __future__ import annotations

import argparse
import sys

from pytgi import envs
from pytgi.benchmark import http_cli


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    from pytgi.benchmark.engine.cli import add_engine_bench_args

    http_cli.add_http_bench_args(parser)
    add_engine_bench_args(parser, http_cli.declared_flags())


def run_bench(args: argparse.Namespace) -> int:
    """`--url` → the HTTP load test; `--model-id` → the engine benchmark."""
    from pytgi.benchmark.engine.cli import engine_value, run_engine_bench

    if getattr(args, "url", None):
        args.cache_dir = envs.cache_dir()  # where a GGUF --tokenizer-name's tokenizer is prepared
        return http_cli.run_http_bench(args)
    if engine_value(args, "model_id"):
        return run_engine_bench(args)
    return _fail("give --url URL (benchmark a server) or --model-id ID (benchmark the engine)")


def run_compare_cli(argv: list[str]) -> int:
    """`pytgi bench compare A.json B.json [--output PATH]`, the HTTP benchmark's comparison."""
    parser = argparse.ArgumentParser(
        prog="pytgi bench compare", description="Compare two benchmark results files."
    )
    http_cli.add_compare_args(parser)
    return http_cli.run_compare(parser.parse_args(argv))


def _fail(message: str) -> int:
    print(f"pytgi bench: error: {message}", file=sys.stderr)
    return 2
