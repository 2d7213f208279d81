"""`pytgi bench --url` end to end against the fake server: files written, numbers consistent,
clear endings for unreachable and failing servers, bad flags, and `compare`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.options import BenchOptions
from pytgi.benchmark.http.records import StreamRecorder
from pytgi.benchmark.http_cli import main, run_load_bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def load(out_dir: Path) -> dict:
    return json.loads((out_dir / "results.json").read_text())


def assert_consistent(step: dict) -> None:
    assert step["num_sent"] == step["num_succeeded"] + step["num_failed"] == len(step["requests"])
    for metric in ("ttft_ms", "itl_ms", "e2e_ms", "tpot_ms"):
        dist = step[metric]
        if dist is not None:
            assert dist["min"] <= dist["p50"] <= dist["p90"] <= dist["p95"] <= dist["p99"]
            assert dist["p99"] <= dist["max"]


@pytest.mark.parametrize("api", ["tgi", "chat", "completions"])
def test_concurrency_sweep_writes_consistent_results_report_and_plots(
    fake_server, bench_argv, tmp_path, capsys, api
):
    fake_server.reset(token_delay_s=0.002)
    argv = bench_argv(fake_server.url, "--api", api, "--concurrency", "1,3")
    argv += ["--warmup-requests", "0"] + ([] if api == "tgi" else ["--no-plots"])  # plots: once
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    out_dir = tmp_path / "out"
    data = load(out_dir)
    assert data["format"] == "pytgi-bench-http/1" and data["target"]["api"] == api
    assert [s["label"] for s in data["steps"]] == ["c=1", "c=3"]
    for step in data["steps"]:
        assert_consistent(step)
        assert step["num_sent"] == 12 and step["num_failed"] == 0
        assert step["num_server_counted"] == 12
        for request in step["requests"]:  # the events we counted are the usage the server reported
            assert request["output_tokens"] == request["token_events"]
    total = sum(r["output_tokens"] for s in data["steps"] for r in s["requests"])
    assert total == fake_server.stats.num_generated_tokens  # no warm-up: every token is measured
    report = (out_dir / "report.md").read_text()
    assert "| c=1 |" in report and "| c=3 |" in report
    if api == "tgi":
        assert "(throughput_latency.png)" in report
        for name in ("throughput_latency.png", "ttft_distribution.png", "itl_distribution.png"):
            png = (out_dir / name).read_bytes()
            assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    assert "Peak throughput" in out and "| c=3 |" in out
    assert data["target"]["model"] == "fake/model"  # from GET /info or GET /v1/models
    if api != "tgi":
        assert fake_server.stats.payloads[0]["model"] == "fake/model"


def test_rate_sweep_with_slo_marks_each_step(fake_server, bench_argv, tmp_path, capsys):
    argv = bench_argv(fake_server.url, "--rates", "20,40", "--slo-ttft-ms", "5000", "--no-plots")
    code, out, _ = run_cli(argv + ["--duration", "0.3", "--warmup-requests", "2"], capsys)
    assert code == 0
    data = load(tmp_path / "out")
    assert [s["mode"] for s in data["steps"]] == ["rate", "rate"]
    assert all(s["meets_slo"] for s in data["steps"]) and data["best_load"] == 40
    assert data["slo"]["ttft_ms"] == 5000 and data["load_mode"] == "rate"
    assert "Highest load meeting the SLO" in out and "**40 req/s**" in out
    assert not list((tmp_path / "out").glob("*.png"))
    assert "## Plots" not in (tmp_path / "out" / "report.md").read_text()
    for step in data["steps"]:
        assert_consistent(step)
        assert step["num_warmup"] == 2


def test_unreachable_url_ends_with_a_clear_summary(closed_port_url, bench_argv, tmp_path, capsys):
    code, out, err = run_cli(bench_argv(closed_port_url, "--concurrency", "1,2"), capsys)
    assert code == 1
    assert "Stopped early" in out and f"cannot connect to {closed_port_url}" in out
    assert "Traceback" not in out + err
    data = load(tmp_path / "out")
    assert len(data["steps"]) == 1 and data["steps"][0]["num_succeeded"] == 0
    assert_consistent(data["steps"][0])
    assert (tmp_path / "out" / "report.md").exists()


def test_failing_server_ends_with_a_clear_summary(fake_server, bench_argv, tmp_path, capsys):
    fake_server.reset(error_mode="event")
    code, out, err = run_cli(bench_argv(fake_server.url, "--api", "chat"), capsys)
    assert code == 1
    assert "422: Input validation error: boom" in out and "Traceback" not in out + err
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Errors" in report and "Input validation error: boom" in report


def test_partial_errors_are_counted_and_reported(fake_server, bench_argv, tmp_path, capsys):
    fake_server.reset(error_mode="http", fail_every=3)
    code, _, _ = run_cli(
        bench_argv(fake_server.url, "--warmup-requests", "0", "--no-plots"), capsys
    )
    assert code == 0
    step = load(tmp_path / "out")["steps"][0]
    assert_consistent(step)
    assert step["num_failed"] == 4 and step["error_rate"] == pytest.approx(4 / 12)
    assert step["errors"] == {"HTTP 503: Model is overloaded": 4}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--prompt-tokens", "gauss:1,2"], "unknown length distribution 'gauss'"),
        (["--find-max-rate"], "--find-max-rate needs an objective"),
        (["--concurrency", "1", "--rates", "2"], "choose one of"),
        (["--concurrency", "0"], "--concurrency values must be > 0"),
        (["--rates", "fast"], "--rates takes a comma-separated list"),
        (["--duration", "0"], "--duration must be > 0"),
        (["--tokenizer-name", "/nonexistent/tokenizer/dir"], "/nonexistent/tokenizer/dir"),
        (["--prompts-file", "/nonexistent/prompts.txt"], "cannot read prompts file"),
    ],
)
def test_bad_settings_exit_2_with_a_message(closed_port_url, bench_argv, capsys, flags, message):
    code, _, err = run_cli(bench_argv(closed_port_url, *flags), capsys)
    assert code == 2
    assert message in err and err.startswith("pytgi bench: error:")


def test_url_is_required(bench_argv, capsys):
    argv = [a for a in bench_argv("x") if a not in ("--url", "x")]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "--url is required" in err


def test_options_record_the_settings(parse_bench_args, bench_argv):
    argv = bench_argv("http://127.0.0.1:1", "--find-max-rate", "--slo-itl-ms", "50")
    args = parse_bench_args(argv)
    options = BenchOptions.from_args(args)
    settings = options.settings()
    assert settings["plan"]["mode"] == "search" and settings["plan"]["rate_max"] == 64.0
    assert settings["workload"]["prompt_tokens"] == "uniform:4,24"
    assert settings["bounds"]["warmup_requests"] == "auto"
    args.slo_percentile = 42
    with pytest.raises(BenchConfigError, match="--slo-percentile"):
        BenchOptions.from_args(args)


def test_compare_puts_two_runs_side_by_side(fake_server, bench_argv, tmp_path, capsys):
    fake_server.reset(token_delay_s=0.001)
    options = ["--max-requests", "4", "--no-plots"]
    assert main(bench_argv(fake_server.url, "--name", "fast", *options)) == 0
    fast = tmp_path / "fast.json"
    (tmp_path / "out" / "results.json").rename(fast)
    fake_server.reset(token_delay_s=0.01)
    assert main(bench_argv(fake_server.url, "--name", "slow", *options)) == 0
    capsys.readouterr()
    output = tmp_path / "compare.md"
    code, out, _ = run_cli(["compare", str(fast), str(tmp_path / "out" / "results.json"),
                            "--output", str(output)], capsys)  # fmt: skip
    assert code == 0 and output.read_text() == out
    assert "A = fast · B = slow" in out and "## c=1" in out
    e2e_row = next(line for line in out.splitlines() if line.startswith("| E2E p50"))
    cells = [c.strip() for c in e2e_row.strip("|").split("|")]
    assert float(cells[3].rstrip("×")) > 1.5 and cells[4] == "A"  # B is slower: A is better
    tps_row = next(line for line in out.splitlines() if line.startswith("| output tokens / s"))
    assert tps_row.rstrip(" |").endswith("A")


def test_compare_rejects_a_file_that_is_not_results(tmp_path, capsys):
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    code, _, err = run_cli(["compare", str(other), str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "not a pytgi bench results file" in err


def test_module_runs_alone_without_importing_torch():
    code = (
        "import sys, pytgi.benchmark.http_cli as cli; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
        "sys.exit(cli.main(['--help']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--url" in proc.stdout and "--find-max-rate" in proc.stdout


class SleepingSender:
    """A non-HTTP target for the `run_load_bench` hook: each request yields its tokens after
    short sleeps, timed by the same `StreamRecorder` the HTTP client uses."""

    def __init__(self) -> None:
        self.num_sent = 0

    async def send(self, spec):
        self.num_sent += 1
        recorder = StreamRecorder(spec)
        for _ in range(spec.max_new_tokens):
            await asyncio.sleep(0.001)
            recorder.record_token_event()
        return recorder.finish(server_output_tokens=spec.max_new_tokens)

    async def aclose(self) -> None:
        pass


def test_other_targets_plug_in_through_run_load_bench(parse_bench_args, bench_argv, tmp_path):
    sender = SleepingSender()

    async def open_target(options):
        return sender, {"url": None, "api": "in-process", "model": "sleepy"}

    args = parse_bench_args(bench_argv("", "--concurrency", "2", "--no-plots"))
    assert run_load_bench(args, open_target) == 0
    data = load(tmp_path / "out")
    assert data["name"] == "in-process @ in-process" and data["target"]["model"] == "sleepy"
    step = data["steps"][0]
    assert_consistent(step)
    assert step["num_sent"] == 12 and sender.num_sent == 12 + 2  # two warm-up requests
    assert all(r["token_events"] == r["output_tokens"] for r in step["requests"])


def test_tokenizer_name_takes_a_gguf_file(tiny_gguf):
    """`pytgi bench --tokenizer-name model.gguf`: the file's own tokenizer, as the server's."""
    from pytgi.benchmark.http.tokenizer import load_tokenizer

    path, model_dir = tiny_gguf
    text = "And God said, Let there be light"
    reference = load_tokenizer(str(model_dir / "tokenizer.json"))
    cache_dir = os.environ["PYTGI_CACHE_DIR"]  # set by tests/conftest.py
    assert load_tokenizer(str(path), cache_dir=cache_dir).encode(text) == reference.encode(text)
