"""HTTP benchmark test fixtures: a tiny BPE tokenizer, the fake SSE server, a closed port."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest
from benchmark.fake_server import FakeServer
from fixtures.tiny_models import build_tokenizer

from pytgi.benchmark.http_cli import add_http_bench_args


@pytest.fixture(scope="session")
def bench_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE trained offline on a few hundred words (tokenizer.json in the dir)."""
    path = tmp_path_factory.mktemp("bench-tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def _fake_server_process():
    server = FakeServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fake_server(_fake_server_process) -> FakeServer:
    """The running fake server, with default settings and zeroed counters."""
    _fake_server_process.reset()
    return _fake_server_process


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def bench_argv(bench_tokenizer_dir, tmp_path):
    """`bench_argv(url, *flags)`: a full `pytgi bench` command line with small, fast defaults."""

    def build(url: str, *flags: str) -> list[str]:
        return [
            "--url", url,
            "--tokenizer-name", str(bench_tokenizer_dir),
            "--prompt-tokens", "uniform:4,24",
            "--output-tokens", "uniform:2,12",
            "--duration", "5",
            "--max-requests", "12",
            "--request-timeout", "10",
            "--output-dir", str(tmp_path / "out"),
            "--no-progress",
            *flags,
        ]  # fmt: skip

    return build


@pytest.fixture
def parse_bench_args():
    """`parse_bench_args(argv) -> argparse.Namespace` with the `pytgi bench` flags."""

    def parse(argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_http_bench_args(parser)
        return parser.parse_args(argv)

    return parse
