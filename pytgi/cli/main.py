"""`pytgi` command line: serve, generate, bench, download-weights. `text-generation-launcher` =
serve.
"""

from __future__ import annotations

import argparse
import sys

from pytgi import envs
from pytgi.cli.flags import SERVE_FLAGS, add_flags, add_refused_flags, add_version_flag


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pytgi", description=__doc__)
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="Run the TGI-compatible HTTP server")
    add_version_flag(serve)
    add_flags(serve, SERVE_FLAGS)
    add_refused_flags(serve)

    from pytgi.cli.generate import add_generate_args

    add_generate_args(sub.add_parser("generate", help="Generate text for one prompt"))

    from pytgi.cli.bench import add_bench_args

    add_bench_args(
        sub.add_parser("bench", help="Benchmark the engine (--model-id) or a server (--url)")
    )

    from pytgi.cli.download import add_download_args

    add_download_args(sub.add_parser("download-weights", help="Download and convert weights"))
    return parser


def main(argv: list[str] | None = None) -> int:
    envs.set_default_threading_env()  # before anything imports torch: OpenMP reads it at load
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["bench", "compare"]:
        from pytgi.cli.bench import run_compare_cli

        return run_compare_cli(argv[2:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from pytgi.cli.launcher import serve

        return serve(args)
    if args.command == "generate":
        from pytgi.cli.generate import run_generate

        return run_generate(args)
    if args.command == "bench":
        from pytgi.cli.bench import run_bench

        return run_bench(args)
    from pytgi.cli.download import run_download

    args.hf_token = getattr(args, "hf_token", None) or envs.hf_token()
    args.hub_offline = getattr(args, "hub_offline", False) or envs.hub_offline()
    return run_download(args)


def launcher_main(argv: list[str] | None = None) -> int:
    """`text-generation-launcher [flags]`: TGI's launcher name for `pytgi serve`."""
    envs.set_default_threading_env()
    parser = argparse.ArgumentParser(prog="text-generation-launcher")
    add_version_flag(parser)
    add_flags(parser, SERVE_FLAGS)
    add_refused_flags(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from pytgi.cli.launcher import serve

    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
