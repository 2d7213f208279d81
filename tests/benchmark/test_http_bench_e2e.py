"""`pytgi bench --url` against the real pytgi server (the `pytgi_server_url` fixture of
tests/conftest.py): a small sweep completes, its counts add up, the tokens it counts equal the
usage the server reports, and the report and plots are written. Skipped where no such fixture
is provided.
"""

from __future__ import annotations

import json

import httpx
import pytest

from pytgi.benchmark.http_cli import main


@pytest.fixture
def server_url(request) -> str:
    try:
        return request.getfixturevalue("pytgi_server_url")
    except pytest.FixtureLookupError:
        pytest.skip("no pytgi_server_url fixture: the real server is not available here")


@pytest.mark.parametrize("api", ["tgi", "chat", "completions"])
def test_small_sweep_against_the_real_server(server_url, bench_argv, tmp_path, capsys, api):
    argv = bench_argv(server_url, "--api", api, "--concurrency", "1,2", "--max-requests", "4")
    code = main(argv + ["--warmup-requests", "0", "--duration", "60", "--request-timeout", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [s["label"] for s in data["steps"]] == ["c=1", "c=2"]
    for step in data["steps"]:
        assert step["num_sent"] == step["num_succeeded"] + step["num_failed"] == 4
        assert step["num_failed"] == 0, step["errors"]
        assert step["num_server_counted"] == 4  # details.generated_tokens / usage on every request
        for metric in ("ttft_ms", "e2e_ms"):
            dist = step[metric]
            assert dist["min"] <= dist["p50"] <= dist["p90"] <= dist["p99"] <= dist["max"]
        for request in step["requests"]:  # the events we counted = the usage it reported
            assert request["output_tokens_source"] == "server"
            assert request["token_events"] == request["output_tokens"] >= 1
    for name in ("report.md", "throughput_latency.png", "ttft_distribution.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


@pytest.mark.parametrize("api", ["tgi", "chat"])
def test_prompts_longer_than_the_server_allows_are_kept_inside_its_limits(
    server_url, bench_argv, tmp_path, capsys, demo_model_dir, api
):
    """Every prompt drawn is past the server's context: the bench reads `/info` and keeps each
    request inside `max_input_tokens` / `max_total_tokens`, so none is refused."""
    info = httpx.get(f"{server_url}/info", timeout=10).json()
    too_long = f"uniform:{info['max_total_tokens'] + 100},{info['max_total_tokens'] + 400}"
    argv = bench_argv(server_url, "--api", api, "--concurrency", "2", "--max-requests", "4")
    argv += ["--tokenizer-name", str(demo_model_dir), "--prompt-tokens", too_long]
    argv += ["--output-tokens", "200", "--warmup-requests", "0", "--request-timeout", "60"]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert f"max_input_tokens={info['max_input_tokens']}" in captured.err
    step = json.loads((tmp_path / "out" / "results.json").read_text())["steps"][0]
    assert step["num_failed"] == 0, step["errors"]
    for request in step["requests"]:
        assert request["prompt_tokens"] < info["max_input_tokens"]
