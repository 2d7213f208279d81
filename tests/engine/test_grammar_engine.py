"""Constrained decoding through the real engine: a tiny random-weight Llama, its BPE vocabulary and
llguidance. Every constrained output validates; constrained and free requests share batches
without changing each other's tokens; preemption, prefix hits, seeded sampling and speculation
keep outputs unchanged; grammar failures end their request only, with the grammar error kind."""

from __future__ import annotations

import json
import re
import threading
import time

import jsonschema
import numpy as np
import pytest

from pytgi.config import GrammarConfig
from pytgi.messages.outputs import ErrorKind
from pytgi.messages.request import EngineRequest, FinishReason
from pytgi.messages.sampling_params import GrammarSpec, SamplingParams, StoppingParams
from pytgi.runtime.llm import LLM

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
JSON = GrammarSpec.json_schema(PERSON)
PROMPTS = [
    "The quick brown fox",
    "Hello world! How are you",
    "Numbers: 0 1 2",
    "The server streams",
    "In the beginning",
]
PARAMS = [
    SamplingParams(grammar=JSON),
    SamplingParams(do_sample=True, temperature=1.3, seed=11, grammar=JSON),
    SamplingParams(grammar=GrammarSpec.regex(DATE)),
    SamplingParams(),  # free
    SamplingParams(do_sample=True, top_k=20, seed=5, repetition_penalty=1.3, grammar=JSON),
]
MAX_NEW = 80


def make_llm(model_dir, **options) -> LLM:
    options = {"block_size": 4, "num_blocks": 512, "max_batch_prefill_tokens": 32, **options}
    return LLM(str(model_dir), num_threads=1, **options)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference(llm):
    """Each request alone (no batch, no prefix hit): what every other run must reproduce."""
    return [
        llm.generate([p], [s], max_new_tokens=MAX_NEW)[0].token_ids
        for p, s in zip(PROMPTS, PARAMS, strict=True)
    ]


def check_valid(outputs):
    for out, params in zip(outputs, PARAMS, strict=True):
        if params.grammar is None:
            continue
        assert out.finish_reason == FinishReason.EOS_TOKEN, out.text  # the grammar ended it
        if params.grammar.kind == "json":
            jsonschema.validate(json.loads(out.text), PERSON)
        else:
            assert re.fullmatch(DATE, out.text, flags=re.ASCII), out.text


def test_mixed_batch_outputs_validate_and_match_each_request_alone(llm, reference):
    outputs = llm.generate(PROMPTS, PARAMS, max_new_tokens=MAX_NEW)
    check_valid(outputs)
    assert [o.token_ids for o in outputs] == reference
    assert outputs[3].finish_reason == FinishReason.LENGTH  # the free row is not constrained
    again = llm.generate(PROMPTS, PARAMS, max_new_tokens=MAX_NEW)  # prompts from the cache
    assert [o.token_ids for o in again] == reference
    assert all(o.num_cached_tokens > 0 for o in again[:2])


def test_preemption_keeps_constrained_outputs(tiny_llama_dir, reference):
    small = make_llm(tiny_llama_dir, num_blocks=40)  # 5 requests need ~115 blocks together
    try:
        outputs = small.generate(PROMPTS, PARAMS, max_new_tokens=MAX_NEW)
        assert small.core.scheduler.num_preemptions > 0
    finally:
        small.close()
    check_valid(outputs)
    assert [o.token_ids for o in outputs] == reference


def test_speculation_verifies_only_allowed_drafts_and_keeps_outputs(tiny_llama_dir, reference):
    spec = make_llm(tiny_llama_dir, speculate=3, speculation_policy="always")
    checked = record_draft_checks(spec)
    try:
        outputs = spec.generate(PROMPTS, PARAMS, max_new_tokens=MAX_NEW)
        stats = spec.core.stats()
    finally:
        spec.close()
    check_valid(outputs)
    assert [o.token_ids for o in outputs] == reference
    assert stats.num_draft_tokens > 0 and checked["grammar_drafts"] > 0


def record_draft_checks(llm: LLM) -> dict[str, int]:
    """Wrap the executor: every draft of a grammar request must be allowed by the mask row before
    it (the rows after the draft), and each request has one mask row per sampled row."""
    executor, counts = llm.core.executor, {"grammar_drafts": 0}
    execute = executor.execute

    def checked_execute(scheduler_output, grammar_masks=None):
        if grammar_masks is not None:
            grammar_masks.wait()  # the rows are filled while the forward runs
        for r in scheduler_output.requests:
            masks = r.grammar_bitmask
            if masks is None:
                continue
            assert masks.shape[0] == 1 + len(r.draft_ids)
            for j, draft in enumerate(r.draft_ids):
                assert allows(masks[j], draft), (r.request_id, j, draft)
                counts["grammar_drafts"] += 1
        return execute(scheduler_output, grammar_masks)

    executor.execute = checked_execute
    return counts


def allows(mask_row: np.ndarray, token: int) -> bool:
    return bool((int(mask_row.view(np.uint32)[token // 32]) >> (token % 32)) & 1)


def test_grammar_end_stops_even_when_eos_is_ignored(llm):
    out = llm.generate(PROMPTS[:1], PARAMS[:1], max_new_tokens=MAX_NEW, ignore_eos=True)[0]
    assert out.finish_reason == FinishReason.EOS_TOKEN
    jsonschema.validate(json.loads(out.text), PERSON)


def request(rid: str, llm: LLM, grammar: GrammarSpec | None, max_new: int = 30) -> EngineRequest:
    stopping = StoppingParams(max_new, tuple(llm.tokenizer.eos_token_ids))
    ids = llm.tokenizer.encode("The quick brown fox").ids
    return EngineRequest(rid, ids, SamplingParams(grammar=grammar), stopping)


def run_until_done(core, max_steps=2000):
    deltas: dict[str, list] = {}
    for _ in range(max_steps):
        if not core.has_unfinished():
            return deltas
        for delta in core.step():
            deltas.setdefault(delta.request_id, []).append(delta)
    raise AssertionError("the engine did not finish its requests")


def test_grammar_failures_end_their_request_only(llm):
    core = llm.core
    core.add_request(request("unsatisfiable", llm, GrammarSpec.regex(r"[^\s\S]")))  # at compile
    core.add_request(request("huge", llm, GrammarSpec.regex("a{1000000}")))  # lexer limit, later
    core.add_request(request("free", llm, None))
    deltas = run_until_done(core)
    (failed,) = deltas["unsatisfiable"]
    assert failed.error_kind == ErrorKind.GRAMMAR and not failed.new_tokens
    assert failed.error == "no output can satisfy the grammar"
    assert deltas["huge"][-1].error_kind == ErrorKind.GRAMMAR
    assert "too many" in deltas["huge"][-1].error
    assert deltas["free"][-1].finish_reason == FinishReason.LENGTH
    assert sum(len(d.new_tokens) for d in deltas["free"]) == 30
    assert not core.scheduler.requests


def test_engine_without_grammar_refuses_grammar_requests(tiny_llama_dir):
    off = make_llm(tiny_llama_dir, grammar=False)
    try:
        assert not off.core.cache_info.supports_grammar
        off.core.add_request(request("g", off, JSON))
        (delta,) = run_until_done(off.core)["g"]
    finally:
        off.close()
    assert delta.error_kind == ErrorKind.GRAMMAR and "off" in delta.error


@pytest.fixture
def blocked_compiler(llm):
    """The compiler's only thread held busy until the test releases it."""
    release = threading.Event()
    assert llm.core.grammar.compiler.config.compile_threads == 1
    llm.core.grammar.compiler._pool.submit(release.wait)
    yield release
    release.set()


def test_a_compiling_grammar_blocks_nobody_and_joins_when_ready(llm, blocked_compiler):
    core = llm.core
    grammar = GrammarSpec.regex(r"(yes|no), [a-z]{2,5}\.")  # not compiled before in this session
    core.add_request(request("waits", llm, grammar))
    core.add_request(request("free", llm, None, max_new=5))
    deltas = run_until_done_or(core, lambda d: "free" in d and d["free"][-1].finished)
    assert "waits" not in deltas  # the free request ran to its end meanwhile
    assert [r.request_id for r in core.scheduler.waiting_for_grammar] == ["waits"]
    blocked_compiler.set()
    deltas = run_until_done(core)
    assert deltas["waits"][-1].finish_reason == FinishReason.EOS_TOKEN


def test_compile_timeout_and_abort_while_compiling(tiny_llama_dir):
    timed = make_llm(tiny_llama_dir, grammar=GrammarConfig(compile_timeout_s=0.3))
    release = threading.Event()
    timed.core.grammar.compiler._pool.submit(release.wait)
    try:
        core = timed.core
        core.add_request(request("aborted", timed, JSON))
        core.abort("aborted")
        assert not core.scheduler.waiting_for_grammar and not core.scheduler.requests
        start = time.monotonic()
        core.add_request(request("late", timed, GrammarSpec.regex("[a-z]+")))
        (delta,) = run_until_done(core)["late"]
        assert 0.3 <= time.monotonic() - start < 5
        assert delta.error_kind == ErrorKind.GRAMMAR and "more than 0.3 s" in delta.error
    finally:
        release.set()
        timed.close()


def run_until_done_or(core, done, max_steps=2000):
    deltas: dict[str, list] = {}
    for _ in range(max_steps):
        for delta in core.step():
            deltas.setdefault(delta.request_id, []).append(delta)
        if done(deltas):
            return deltas
    raise AssertionError("condition not reached")
