"""Workload: length specs, exact-length prompt synthesis, profiles, prompts files, tokenizers."""

from __future__ import annotations

import json
import random

import pytest

from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.lengths import parse_length_spec
from pytgi.benchmark.http.prompts import synthesize_prompt
from pytgi.benchmark.http.tokenizer import load_tokenizer
from pytgi.benchmark.http.workload import PROFILES, Workload, WorkloadConfig


@pytest.fixture(scope="module")
def tokenizer(bench_tokenizer_dir):
    return load_tokenizer(str(bench_tokenizer_dir))


@pytest.mark.parametrize(
    "spec, low, high",
    [
        ("64", 64, 64),
        ("uniform:3,9", 3, 9),
        ("normal:50,30,10,80", 10, 80),
        ("lognormal:100,1.5,20,300", 20, 300),
    ],
)
def test_length_specs_sample_within_bounds_and_round_trip(spec, low, high):
    dist = parse_length_spec(spec)
    samples = [dist.sample(random.Random(i)) for i in range(300)]
    assert all(low <= s <= high for s in samples)
    assert parse_length_spec(dist.describe()) == dist
    if low != high:  # really a distribution: reaches both ends or at least spreads out
        assert len(set(samples)) > 3


@pytest.mark.parametrize(
    "spec", ["", "abc", "gauss:1,2", "uniform:5", "uniform:9,3", "normal:5,1,10,2", "0", "-3"]
)
def test_bad_length_specs_are_rejected(spec):
    with pytest.raises(BenchConfigError):
        parse_length_spec(spec)


@pytest.mark.parametrize("style", ["prose", "code"])
def test_synthesized_prompts_have_exact_token_counts(tokenizer, style):
    rng = random.Random(7)
    for num_tokens in [1, 2, 3, 5, 17, 64, 200, 513]:
        text, count = synthesize_prompt(tokenizer, rng, num_tokens, style)
        assert count == num_tokens
        assert tokenizer.count(text) == num_tokens


def test_workload_is_seeded_and_fresh_per_step(tokenizer):
    config = WorkloadConfig(profile="chat", seed=3)
    first = Workload(config, tokenizer).build_specs(6, step_index=0)
    again = Workload(config, tokenizer).build_specs(6, step_index=0)
    next_step = Workload(config, tokenizer).build_specs(6, step_index=1)
    other_seed = Workload(WorkloadConfig(seed=4), tokenizer).build_specs(6, step_index=0)
    assert first == again
    assert not {s.prompt for s in first} & {s.prompt for s in next_step}
    assert first != other_seed
    assert len({s.prompt for s in first}) == 6  # no two requests share a prompt


@pytest.mark.parametrize("name", list(PROFILES))
def test_profiles_build_requests_within_their_ranges(tokenizer, name):
    config = WorkloadConfig(profile=name)
    specs = Workload(config, tokenizer).build_specs(8, 0)
    prompt_dist, output_dist = config.prompt_lengths, config.output_lengths
    for spec in specs:
        assert tokenizer.count(spec.prompt) == spec.num_prompt_tokens
        assert prompt_dist.min_tokens <= spec.num_prompt_tokens
        assert spec.num_prompt_tokens <= (prompt_dist.max_tokens or spec.num_prompt_tokens)
        assert output_dist.min_tokens <= spec.max_new_tokens
        assert spec.max_new_tokens <= (output_dist.max_tokens or spec.max_new_tokens)


def test_overrides_replace_the_profile_lengths(tokenizer):
    config = WorkloadConfig(profile="code", prompt_tokens="12", output_tokens="uniform:1,2")
    specs = Workload(config, tokenizer).build_specs(5, 0)
    assert {s.num_prompt_tokens for s in specs} == {12}
    assert {s.max_new_tokens for s in specs} <= {1, 2}


def test_jsonl_prompts_file_cycles_and_keeps_output_lengths(tokenizer, tmp_path):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "hello world", "output_tokens": 5}, {"text": "the quick brown fox"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    config = WorkloadConfig(prompts_file=path, output_tokens="9")
    specs = Workload(config, tokenizer).build_specs(5, 0)
    assert [s.prompt for s in specs].count("hello world") in (2, 3)
    for spec in specs:
        assert spec.max_new_tokens == (5 if spec.prompt == "hello world" else 9)
        assert spec.num_prompt_tokens == tokenizer.count(spec.prompt)


def test_text_prompts_file_has_one_prompt_per_line(tokenizer, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\nsecond prompt here\n")
    specs = Workload(WorkloadConfig(prompts_file=path), tokenizer).build_specs(2, 0)
    assert sorted(s.prompt for s in specs) == ["first prompt", "second prompt here"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"prompt": "ok"}\nnot json\n', "bad.jsonl:2"),
        ("bad2.jsonl", '{"prompt": ""}\n', "non-empty 'prompt'"),
        ("bad3.jsonl", '{"prompt": "x", "output_tokens": 0}\n', "positive integer"),
        ("empty.txt", "\n\n", "no prompts"),
    ],
)
def test_bad_prompts_files_name_the_problem(tokenizer, tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(BenchConfigError, match=message):
        Workload(WorkloadConfig(prompts_file=path), tokenizer)


def test_unknown_profile_and_missing_file_fail_early(tokenizer, tmp_path):
    with pytest.raises(BenchConfigError, match="unknown profile"):
        WorkloadConfig(profile="poetry")
    with pytest.raises(BenchConfigError, match="cannot read prompts file"):
        Workload(WorkloadConfig(prompts_file=tmp_path / "missing.txt"), tokenizer)


def test_tokenizer_from_file_directory_and_hub_cache(bench_tokenizer_dir, tmp_path, monkeypatch):
    from huggingface_hub import constants

    by_file = load_tokenizer(str(bench_tokenizer_dir / "tokenizer.json"))
    by_dir = load_tokenizer(str(bench_tokenizer_dir))
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes((bench_tokenizer_dir / "tokenizer.json").read_bytes())
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    by_hub_id = load_tokenizer("acme/tiny")
    text = "the server streams tokens"
    assert by_file.encode(text) == by_dir.encode(text) == by_hub_id.encode(text)
    assert by_file.decode(by_file.encode(text)) == text
    with pytest.raises(BenchConfigError, match="acme/missing"):
        load_tokenizer("acme/missing")


def test_tokenizer_errors_are_typed(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BenchConfigError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "broken.json").write_text("{not a tokenizer")
    with pytest.raises(BenchConfigError, match="cannot read tokenizer"):
        load_tokenizer(str(tmp_path / "broken.json"))
