"""The engine benchmark runs end to end on a tiny model and reports self-consistent numbers.

Never timed assertions: only counts, orderings and identities that hold on any machine.
"""

from __future__ import annotations

import json
import math

import pytest

from pytgi.benchmark.engine.metrics import percentile
from pytgi.benchmark.engine.report import text_report
from pytgi.benchmark.engine.workloads import (
    mixed_workload,
    named_workload,
    random_prompts,
    sweep_workloads,
    uniform_workload,
    warmup_workload,
)


def test_named_workloads_match_the_issue():
    uniform = uniform_workload()
    assert len(uniform.requests) == 16
    assert {(r.prompt_len, r.output_len) for r in uniform.requests} == {(256, 128)}
    mixed = mixed_workload()
    assert len(mixed.requests) == 16
    assert all(64 <= r.prompt_len <= 512 and 32 <= r.output_len <= 256 for r in mixed.requests)
    assert len({r.output_len for r in mixed.requests}) > 8  # really mixed
    assert mixed == mixed_workload()  # fixed seed
    decode1 = named_workload("decode1")
    assert [(r.prompt_len, len(decode1.requests)) for r in decode1.requests] == [(32, 1)]
    with pytest.raises(ValueError, match="unknown workload"):
        named_workload("nope")


def test_sweep_and_prompts():
    cases = sweep_workloads([1, 4], [8, 16], [2])
    assert [c.name for c in cases] == ["b1_p8_o2", "b1_p16_o2", "b4_p8_o2", "b4_p16_o2"]
    assert cases[3].num_prompt_tokens == 64 and cases[3].num_output_tokens == 8
    prompts = random_prompts(cases[3], vocab_size=50, seed="s")
    assert prompts == random_prompts(cases[3], vocab_size=50, seed="s")
    assert prompts != random_prompts(cases[3], vocab_size=50, seed="t")
    assert [len(p) for p in prompts] == [16] * 4
    assert all(0 <= t < 50 for p in prompts for t in p)
    assert len(warmup_workload(cases[3]).requests) == 2


def test_percentile_interpolates():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert math.isnan(percentile([], 50))


@pytest.fixture(scope="module")
def bench_result(tiny_model_factory):
    from pytgi.benchmark.engine.suite import BenchOptions, run_suite

    workloads = (*sweep_workloads([1, 3], [8], [4]), _mixed_tiny())
    options = BenchOptions(
        model_id=str(tiny_model_factory("llama")),
        workloads=workloads,
        num_threads=1,
        repeats=2,
        sequential_sample=2,
        bandwidth_bytes=1 << 24,
        gemm_size=128,
    )
    return run_suite(options, log=lambda line: None)


def _mixed_tiny():
    from pytgi.benchmark.engine.workloads import RequestSpec, Workload

    specs = (RequestSpec(5, 2), RequestSpec(12, 6), RequestSpec(9, 3))
    return Workload("mixed_tiny", "3 requests of mixed lengths", specs)


def test_every_system_serves_every_token(bench_result):
    for case in bench_result.cases:
        systems = set(case.runs)
        single = len(case.workload.requests) == 1
        assert systems == (
            {"pytgi", "hf_sequential"} if single else {"pytgi", "hf_sequential", "hf_static"}
        )
        for runs in case.runs.values():
            assert len(runs) == 2
            for m in runs:
                assert m.num_output_tokens == case.workload.num_output_tokens
                assert m.num_prompt_tokens == case.workload.num_prompt_tokens
                assert m.num_preemptions == 0


def test_numbers_are_consistent(bench_result):
    for case in bench_result.cases:
        for m in case.summary.values():
            assert m.output_tok_s > 0 and m.prefill_tok_s > 0 and m.decode_tok_s > 0
            assert m.ttft_p50_ms <= m.ttft_p90_ms <= m.ttft_p99_ms <= m.wall_s * 1e3
            assert m.itl_p50_ms <= m.itl_p90_ms <= m.itl_p99_ms
            assert m.decode_bw_fraction > 0 and m.prefill_flop_fraction > 0
        for m in (run for runs in case.runs.values() for run in runs):
            assert m.output_tok_s == pytest.approx(m.num_output_tokens / m.wall_s)


def test_identical_requests_replay_after_the_sample(bench_result):
    by_name = {case.workload.name: case for case in bench_result.cases}
    replayed = {
        name: [m.num_replayed for m in by_name[name].runs["hf_sequential"]]
        for name in ("b1_p8_o4", "b3_p8_o4", "mixed_tiny")
    }
    assert replayed == {"b1_p8_o4": [0, 0], "b3_p8_o4": [1, 1], "mixed_tiny": [0, 0]}
    assert "hf_sequential*: 2 of 3 identical requests run" in text_report(bench_result)
    sequential = by_name["b3_p8_o4"].summary["hf_sequential"]
    assert sequential.ttft_p99_ms <= sequential.wall_s * 1e3


def test_roofline_and_footprint(bench_result):
    footprint = bench_result.footprint
    for case in bench_result.cases:
        assert case.roofline.bandwidth_gb_s > 0 and case.roofline.gemm_gflop_s > 0
        assert case.roofline.num_threads == 1
    # tiny llama: untied 384-token vocab, hidden 64
    assert not footprint.tied
    assert footprint.num_embedding_params == footprint.num_head_params == 384 * 64
    assert footprint.decode_weight_bytes == 4 * (footprint.num_params - 384 * 64)


def test_reports_and_json(bench_result, tmp_path):
    from pytgi.benchmark.engine.report import markdown_report
    from pytgi.benchmark.engine.results import FORMAT, write_json

    text = text_report(bench_result)
    markdown = markdown_report(bench_result)
    for case in bench_result.cases:
        assert case.workload.name in text and case.workload.name in markdown
    assert "pytgi / hf_static: output" in text
    assert markdown.count("| pytgi |") == len(bench_result.cases)
    path = tmp_path / "out" / "results.json"
    write_json(bench_result, path, command=["pytgi", "bench"])
    data = json.loads(path.read_text())
    json.dumps(data, allow_nan=False)  # strict JSON: NaN became null
    assert data["format"] == FORMAT
    assert data["machine"]["num_cores"] >= 1 and data["machine"]["torch_version"]
    assert [c["workload"] for c in data["cases"]] == ["b1_p8_o4", "b3_p8_o4", "mixed_tiny"]
    mixed = data["cases"][2]
    assert mixed["requests"] == [[5, 2], [12, 6], [9, 3]]
    assert mixed["roofline"]["bandwidth_gb_s"] > 0
    assert set(mixed["ratios"]) == {"hf_sequential", "hf_static"}
    assert len(mixed["runs"]["pytgi"]) == 2


def test_static_batch_pads_to_the_longest_output(tiny_model_factory):
    from pytgi.benchmark.engine.hf_runner import HfRunner

    runner = HfRunner(tiny_model_factory("llama"), "float32")
    workload = _mixed_tiny()
    trace = runner.run_static(workload, random_prompts(workload, 384, seed=1))
    assert [len(r.token_times_s) for r in trace.requests] == [2, 6, 3]
    assert len(trace.decode_step_s) == 5  # the batch ran until the 6-token request was done
    assert trace.num_decode_tokens == (2 - 1) + (6 - 1) + (3 - 1)
    assert trace.num_prefill_tokens == 5 + 12 + 9


def test_fallback_baseline_runs_the_same_tokens(tiny_model_factory):
    """`--baselines pytgi_transformers`: pytgi against itself through the transformers fallback,
    alternating per round; both serve every token."""
    from pytgi.benchmark.engine.suite import BenchOptions, ratios, run_suite

    options = BenchOptions(
        model_id=str(tiny_model_factory("llama")),
        workloads=tuple(sweep_workloads([2], [8], [4])),
        num_threads=1,
        baselines=("pytgi_transformers",),
        bandwidth_bytes=1 << 24,
        gemm_size=128,
    )
    (case,) = run_suite(options, log=lambda line: None).cases
    assert set(case.runs) == {"pytgi", "pytgi_transformers"}
    assert set(ratios(case)) == {"pytgi_transformers"}
    for runs in case.runs.values():
        assert runs[0].num_output_tokens == case.workload.num_output_tokens


def test_a_gguf_file_is_benchmarked_like_a_checkpoint(tiny_gguf):
    """`pytgi bench --model-id model.gguf`: pytgi serves the file and transformers (the
    baseline) dequantizes it."""
    from pytgi.benchmark.engine.suite import BenchOptions, run_suite

    path, _ = tiny_gguf
    options = BenchOptions(
        model_id=str(path),
        workloads=tuple(sweep_workloads([1], [6], [3])),
        num_threads=1,
        repeats=1,
        bandwidth_bytes=1 << 20,
        gemm_size=64,
    )
    result = run_suite(options, log=lambda line: None)
    (case,) = result.cases
    assert set(case.runs) == {"pytgi", "hf_sequential"}
    for (run,) in case.runs.values():
        assert run.num_output_tokens == case.workload.num_output_tokens
