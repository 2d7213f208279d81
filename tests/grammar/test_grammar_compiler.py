"""GrammarCompiler: cache by spec, asynchronous compiles that do not wait on each other, deadlines,
and every bad input of issue 12 (item 5) ending in a clear GrammarError in bounded time."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest
from grammar_test_cases import INVALID, deep_schema, many_tools

from pytgi.config import GrammarConfig
from pytgi.grammar import GrammarCompiler, GrammarError, PendingGrammar, check_grammar
from pytgi.messages.sampling_params import GrammarSpec

CONFIG = GrammarConfig()
# generous: the limits make these milliseconds; the machine is shared
BOUND_S = 10.0


def spec_of(kind: str, value) -> GrammarSpec:
    return GrammarSpec.json_schema(value) if kind == "json" else GrammarSpec.regex(value)


def test_specs_are_canonical_hashable_and_keep_property_order():
    a = GrammarSpec.json_schema({"properties": {"b": {}, "a": {}}})
    b = GrammarSpec.json_schema({"properties": {"b": {}, "a": {}}})
    assert a == b and hash(a) == hash(b) and a.value == '{"properties":{"b":{},"a":{}}}'
    assert a != GrammarSpec.json_schema({"properties": {"a": {}, "b": {}}})
    assert a.schema == {"properties": {"b": {}, "a": {}}}


def test_equal_specs_compile_once(compiler):
    spec = GrammarSpec.regex("[a-c]{2}")
    first = compiler.compile(spec)
    assert compiler.compile(GrammarSpec.regex("[a-c]{2}")) is first
    assert first.matcher() is not first.matcher()  # each request gets its own state


def test_the_cache_is_bounded_in_estimated_bytes(vocab):
    """Distinct large schemas (each ~7 MB in memory on a real vocabulary) evict the least recently
    used once their estimated bytes pass `cache_bytes`, whatever `cache_size` allows."""
    from pytgi.grammar.compiler import estimated_bytes

    def schema(i: int) -> GrammarSpec:
        properties = {f"p{i}_{j}": {"type": "string", "maxLength": 5} for j in range(40)}
        return GrammarSpec.json_schema({"type": "object", "properties": properties})

    one = estimated_bytes(schema(0))
    assert one > 1 << 20 and one >= 80 * len(schema(0).value)
    compiler = GrammarCompiler(vocab, GrammarConfig(cache_size=1000, cache_bytes=3 * one + 10))
    try:
        first = compiler.compile(schema(0))
        for i in range(1, 6):
            compiler.compile(schema(i))
            assert compiler.cached_bytes <= 3 * one + 10
        assert compiler.num_cached == 3
        assert compiler.cached_bytes == sum(estimated_bytes(schema(i)) for i in (3, 4, 5))
        assert compiler.compile(schema(0)) is not first  # evicted: compiled again
    finally:
        compiler.close()


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.regex("a\ud800"),
        GrammarSpec.json_schema({"properties": {"\udfff": {"type": "string"}}}),
    ],
)
def test_a_lone_surrogate_is_a_grammar_error_not_a_crash(spec):
    with pytest.raises(GrammarError, match="lone UTF-16 surrogate"):
        check_grammar(spec, CONFIG)


def test_failures_are_cached_too(compiler):
    spec = GrammarSpec.json_schema({"type": "stsring"})
    with pytest.raises(GrammarError):
        compiler.compile(spec)
    assert compiler.submit(spec).future is compiler.submit(spec).future


def test_a_slow_compile_does_not_hold_back_another(vocab, monkeypatch):
    """Submitting never blocks, and with two compile threads a grammar stuck in compilation does
    not delay the next one."""
    compiler = GrammarCompiler(vocab, GrammarConfig(compile_threads=2))
    release, real_compile = threading.Event(), compiler._compile
    slow = GrammarSpec.regex("slow")

    def compile_or_wait(spec):
        if spec == slow:
            release.wait(BOUND_S)
        return real_compile(spec)

    monkeypatch.setattr(compiler, "_compile", compile_or_wait)
    try:
        start = time.monotonic()
        pending_slow = compiler.submit(slow)
        assert time.monotonic() - start < 0.5 and pending_slow.poll() is None
        fast = compiler.submit(GrammarSpec.regex("fast")).result()
        assert fast.spec.value == "fast" and pending_slow.poll() is None
        release.set()
        assert pending_slow.result().spec == slow
    finally:
        release.set()
        compiler.close()


def test_a_grammar_past_its_deadline_fails_with_a_clear_error():
    never_done: Future = Future()
    pending = PendingGrammar(never_done, deadline_s=time.monotonic() + 60, timeout_s=60)
    assert pending.poll() is None
    with pytest.raises(GrammarError, match="took more than 60 s"):
        pending.poll(now_s=time.monotonic() + 61)
    late = PendingGrammar(never_done, deadline_s=time.monotonic() + 0.05, timeout_s=0.05)
    with pytest.raises(GrammarError, match="took more than 0.05 s"):
        late.result()


@pytest.mark.parametrize(("name", "kind", "value", "message"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_grammars_fail_before_admission(name, kind, value, message):
    start = time.monotonic()
    with pytest.raises(GrammarError) as info:
        check_grammar(spec_of(kind, value), CONFIG)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert time.monotonic() - start < BOUND_S


def test_lenient_mode_ignores_what_it_cannot_enforce(compiler):
    spec = GrammarSpec.json_schema({"type": "array", "uniqueItems": True}, strict=False)
    check_grammar(spec, CONFIG)
    assert compiler.compile(spec).matcher().error is None


@pytest.mark.parametrize(
    ("label", "spec"),
    [
        ("nesting_200", GrammarSpec.json_schema(deep_schema(200))),
        ("over_size_limit", GrammarSpec.json_schema({"enum": ["x" * 100] * 6000})),
        ("not_json", GrammarSpec("json", "{not json")),
    ],
)
def test_enormous_or_malformed_grammars_are_refused(label, spec):
    with pytest.raises(GrammarError) as info:
        check_grammar(spec, CONFIG)
    assert str(info.value)


@pytest.mark.parametrize(
    "pattern", [r"[^\s\S]", r"[^\x00-\U0010FFFF]"], ids=["empty_class", "nothing"]
)
def test_unsatisfiable_regexes_fail_at_compile(compiler, pattern):
    check_grammar(GrammarSpec.regex(pattern), CONFIG)  # only the vocabulary shows it
    with pytest.raises(GrammarError, match="no output can satisfy the grammar"):
        compiler.compile(GrammarSpec.regex(pattern))


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec.regex(r"(a+)+b"),
        GrammarSpec.regex(r"(a|aa)*c"),
        GrammarSpec.regex(r"[ab]*a[ab]{40}"),
        GrammarSpec.regex(r"((a{1,10}){1,10}){1,10}"),
        GrammarSpec.regex(r"[a-z]{0,100000}"),
        GrammarSpec.json_schema({"type": "string", "minLength": 1000000}),
        GrammarSpec.json_schema({"type": "array", "minItems": 100000}),
        GrammarSpec.json_schema({"enum": [f"value_{i}" for i in range(10000)]}),
        GrammarSpec.json_schema(
            {"properties": {f"p{i}": {"type": "integer"} for i in range(1000)}}
        ),
        GrammarSpec.json_schema(many_tools(1000)),
    ],
    ids=[
        "nested_plus",
        "alternation_star",
        "dfa_blowup",
        "nested_counts",
        "range_1e5",
        "min_length_1e6",
        "min_items_1e5",
        "enum_10000",
        "properties_1000",
        "tools_1000",
    ],
)
def test_pathological_and_huge_grammars_compile_in_bounded_time(compiler, vocab, spec):
    start = time.monotonic()
    compiled = compiler.compile(spec)
    assert time.monotonic() - start < BOUND_S
    matcher, filler_mask = compiled.matcher(), None
    from pytgi.grammar import BitmaskFiller

    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)
    filler_mask = filler.allocate(1)
    start = time.monotonic()
    assert filler.fill([(matcher, 0)], filler_mask) == []
    assert time.monotonic() - start < BOUND_S
