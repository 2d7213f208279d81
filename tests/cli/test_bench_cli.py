"""`pytgi bench`: flag parsing shared with the HTTP benchmark, dispatch, and one engine run."""

from __future__ import annotations

import argparse
import json

import pytest

from pytgi.benchmark import http_cli
from pytgi.benchmark.engine.cli import (
    ENGINE_OPTIONS,
    add_engine_bench_args,
    bench_options,
    engine_value,
    select_workloads,
)
from pytgi.cli import bench
from pytgi.cli.main import build_parser, main


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_engine_flags_parse_next_to_the_http_ones():
    args = parse("--model-id", "m", "--batch-sizes", "1,4", "--prompt-lengths", "8",
                 "--output-lengths", "2,3", "--seed", "7", "--repeats", "3")  # fmt: skip
    assert engine_value(args, "model_id") == "m"
    assert engine_value(args, "seed") == 7
    assert engine_value(args, "repeats") == 3 and engine_value(args, "warmup") == 1
    assert [w.name for w in select_workloads(args)] == [
        "b1_p8_o2", "b1_p8_o3", "b4_p8_o2", "b4_p8_o3",
    ]  # fmt: skip


def test_workload_selection():
    assert [w.name for w in select_workloads(parse("--model-id", "m"))] == [
        "uniform", "mixed", "decode1",
    ]  # fmt: skip
    args = parse("--model-id", "m", "--workload", "mixed,decode1", "--batch-sizes", "2")
    assert [w.name for w in select_workloads(args)] == ["b2_p128_o128", "mixed", "decode1"]


@pytest.mark.parametrize(
    "argv", [["--batch-sizes", "1,x"], ["--batch-sizes", "0"], ["--workload", "bogus"]]
)
def test_bad_values_are_rejected(argv, capsys):
    with pytest.raises(SystemExit):
        parse("--model-id", "m", *argv)
    assert "error" in capsys.readouterr().err


def test_existing_options_are_reused_not_redeclared():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output")
    parser.add_argument("--seed", type=int, default=5)
    add_engine_bench_args(parser, frozenset({"--output", "--seed"}))
    args = parser.parse_args(["--output", "r.json", "--model-id", "m"])
    assert engine_value(args, "output") == "r.json"
    assert engine_value(args, "seed") == 5
    assert engine_value(args, "markdown") is None


def test_the_http_flags_the_engine_shares_are_declared_once():
    """Every flag both benchmarks take is the HTTP side's, under the same dest."""
    shared = http_cli.declared_flags() & {name for name, _ in ENGINE_OPTIONS}
    assert "--seed" in shared
    args = parse("--model-id", "m", "--seed", "7", "--quantize", "eetq")
    assert engine_value(args, "seed") == 7 and engine_value(args, "quantize") == "eetq"


def test_quantized_engine_options_reach_the_bench():
    args = parse("--model-id", "m", "--quantize", "eetq", "--quantize-activations", "int8")
    options = bench_options(args)
    assert (options.quantize, options.quantize_activations) == ("eetq", "int8")


def test_dispatch_needs_a_target(capsys):
    assert bench.run_bench(parse()) == 2
    assert "--url" in capsys.readouterr().err


def test_dispatch_to_http(monkeypatch):
    calls = []

    class FakeHttpCli:
        @staticmethod
        def run_http_bench(args):
            calls.append(args.url)
            return 0

    args = parse("--url", "http://127.0.0.1:1")
    monkeypatch.setattr(bench, "http_cli", FakeHttpCli)
    assert bench.run_bench(args) == 0
    assert calls == ["http://127.0.0.1:1"]


def test_compare_reaches_the_http_benchmark(tmp_path, capsys):
    missing = str(tmp_path / "missing.json")
    assert main(["bench", "compare", missing, missing]) == 2
    assert capsys.readouterr().err


def test_engine_bench_end_to_end(tiny_model_factory, tmp_path, monkeypatch, capsys):
    from pytgi.benchmark.engine import suite
    from pytgi.benchmark.engine.roofline import MachineRoofline

    # the roofline measurement itself is covered in tests/benchmark; keep this run short
    monkeypatch.setattr(suite, "measure_machine", lambda *a: MachineRoofline(10.0, 50.0, 1, None))
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    rc = main(["bench", "--model-id", str(tiny_model_factory("llama")), "--batch-sizes", "2",
               "--prompt-lengths", "6", "--output-lengths", "3", "--warmup", "0",
               "--num-threads", "1", "--no-baseline",
               "--output", str(out), "--markdown", str(md)])  # fmt: skip
    assert rc == 0
    assert "b2_p6_o3" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["config"]["baselines"] == [] and data["config"]["num_threads"] == 1
    (case,) = data["cases"]
    assert list(case["summary"]) == ["pytgi"]
    assert case["summary"]["pytgi"]["num_output_tokens"] == 6
    assert "| pytgi |" in md.read_text()


def test_engine_bench_reports_a_missing_model(tmp_path, capsys):
    rc = main(["bench", "--model-id", str(tmp_path / "absent"), "--workload", "decode1"])
    assert rc == 1
    assert "does not exist" in capsys.readouterr().err
