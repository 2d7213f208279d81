"""`pytgi bench`: one subcommand, two benchmarks, plus `pytgi bench compare A.json B.json`.

`--url URL` load-tests a running server over HTTP (pytgi.benchmark.http_cli); `--model-id ID`
drives the engine in this process and compares it with transformers `generate`
(pytgi.benchmark.engine). The HTTP benchmark's flags are declared first; the engine's are added
after them, reusing any option the HTTP side already declares.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

HTTP_CLI = "pytgi.benchmark.http_cli"


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    http_cli = _http_cli()
    if http_cli is not None:
        http_cli.add_http_bench_args(parser)
    if "--url" not in parser._option_string_actions:
        parser.add_argument("--url", help="HTTP benchmark target (not available in this build)")
    from pytgi.benchmark.engine.cli import add_engine_bench_args

    add_engine_bench_args(parser)


def run_bench(args: argparse.Namespace) -> int:
    """`--url` → the HTTP load test; `--model-id` → the engine benchmark."""
    from pytgi.benchmark.engine.cli import engine_value, run_engine_bench

    if getattr(args, "url", None):
        http_cli = _http_cli()
        if http_cli is None:
            return _fail("the HTTP benchmark (--url) is not available in this build")
        return http_cli.run_http_bench(args)
    if engine_value(args, "model_id"):
        return run_engine_bench(args)
    return _fail("give --url URL (benchmark a server) or --model-id ID (benchmark the engine)")


def run_compare_cli(argv: list[str]) -> int:
    """`pytgi bench compare A.json B.json [--output PATH]`, the HTTP benchmark's comparison."""
    http_cli = _http_cli()
    if http_cli is None or not hasattr(http_cli, "add_compare_args"):
        return _fail("`pytgi bench compare` needs the HTTP benchmark, which this build lacks")
    parser = argparse.ArgumentParser(
        prog="pytgi bench compare", description="Compare two benchmark results files."
    )
    http_cli.add_compare_args(parser)
    return http_cli.run_compare(parser.parse_args(argv))


def _http_cli() -> ModuleType | None:
    """The HTTP benchmark's CLI module, or None when it is not part of this build."""
    try:
        return importlib.import_module(HTTP_CLI)
    except ModuleNotFoundError as exc:
        if exc.name != HTTP_CLI:  # the module exists but one of its imports is broken
            raise
        return None


def _fail(message: str) -> int:
    print(f"pytgi bench: error: {message}", file=sys.stderr)
    return 2
