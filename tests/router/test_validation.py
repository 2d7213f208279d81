"""Validator: TGI's messages, order of checks, defaults and the resolved engine parameters."""

from __future__ import annotations

import json

import pytest

from pytgi.config import LimitsConfig
from pytgi.errors import ValidationError
from pytgi.messages.sampling_params import GrammarSpec
from pytgi.router.grammar import as_tgi_schema
from pytgi.router.params import GenerateParameters, GrammarParam
from pytgi.router.validation import Validator

P = GenerateParameters
pytestmark = pytest.mark.anyio


@pytest.fixture
def validator(tokenizer, limits, cache_info) -> Validator:
    return Validator(tokenizer, limits, cache_info)


async def reject(validator, message, inputs="Hello world", **params):
    with pytest.raises(ValidationError) as info:
        await validator.validate(inputs, P(**params))
    assert info.value.message == f"Input validation error: {message}"
    assert info.value.status_code == 422


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"temperature": 0.0}, "`temperature` must be strictly positive"),
        ({"temperature": -1.0}, "`temperature` must be strictly positive"),
        ({"repetition_penalty": 0.0}, "`repetition_penalty` must be strictly positive"),
        ({"frequency_penalty": 2.5}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        ({"frequency_penalty": -2.1}, "`frequency_penalty` must be >= -2.0 and <= 2.0"),
        ({"top_p": 1.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"top_p": 0.0}, "`top_p` must be > 0.0 and < 1.0"),
        ({"typical_p": 1.0}, "`typical_p` must be > 0.0 and < 1.0"),
        ({"top_k": 0}, "`top_k` must be strictly positive"),
        ({"top_k": -3}, "`top_k` must be strictly positive"),
        ({"max_new_tokens": 0}, "`max_new_tokens` must be strictly positive"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "`stop` supports up to 4 stop sequences. Given: 5"),
        ({"top_n_tokens": 6}, "`top_n_tokens` must be >= 0 and <= 5. Given: 6"),
        ({"truncate": 0}, "`truncate` must be strictly positive and less than 40. Given: 0"),
        ({"truncate": 41}, "`truncate` must be strictly positive and less than 40. Given: 41"),
        ({"best_of": 2}, "you must use sampling when `best_of` is > 1"),
        ({"best_of": 2, "do_sample": True, "seed": 3}, "`seed` must not be set when `best_of` > 1"),
    ],
)
async def test_parameter_messages(validator, params, message):
    await reject(validator, message, **params)


async def test_order_of_checks(validator):
    # temperature before top_p, max_new_tokens before stop count, stop before seed, inputs last
    await reject(validator, "`temperature` must be strictly positive", temperature=0, top_p=1.0)
    await reject(
        validator, "`max_new_tokens` must be strictly positive", max_new_tokens=0, stop=["x"] * 9
    )
    await reject(
        validator,
        "`stop` supports up to 4 stop sequences. Given: 9",
        stop=["x"] * 9,
        best_of=2,
        do_sample=True,
        seed=1,
    )
    await reject(validator, "`top_k` must be strictly positive", inputs="", top_k=0)
    await reject(validator, "`inputs` cannot be empty", inputs="", truncate=0)


async def test_token_limits(validator, tokenizer):
    long_text = "The quick brown fox jumps over the lazy dog. " * 6
    n = len(tokenizer.encode(long_text).ids)
    assert n > 40
    await reject(
        validator,
        f"`inputs` tokens + `max_new_tokens` must be <= 64. Given: {n} `inputs` tokens and 30 "
        "`max_new_tokens`",
        inputs=long_text,
        max_new_tokens=30,
    )
    # too long for the context with the default max_new_tokens (= 0 room left): TGI's first check
    await reject(
        validator,
        f"`inputs` tokens + `max_new_tokens` must be <= 64. Given: {n} `inputs` tokens and 0 "
        "`max_new_tokens`",
        inputs=long_text,
    )
    medium = tokenizer.decode(tokenizer.encode(long_text, add_special_tokens=False).ids[:50])
    m = len(tokenizer.encode(medium).ids)
    assert 40 < m < 64
    await reject(
        validator,
        f"`inputs` must have less than 40 tokens. Given: {m}",
        inputs=medium,
        max_new_tokens=1,
    )
    ok = await validator.validate(long_text, P(truncate=10))
    assert ok.prompt_ids == tokenizer.encode(long_text).ids[-10:]


async def test_max_new_tokens_default_and_chunk(tokenizer, cache_info):
    limits = LimitsConfig(max_input_tokens=1500, max_total_tokens=3000)
    v = Validator(tokenizer, limits, cache_info)
    req = await v.validate("Hello world", P())
    assert req.stopping.max_new_tokens == 3000 - req.input_length
    # only the first 1024-token chunk is validated; the engine then runs until the context is full
    big = await v.validate("Hello world", P(max_new_tokens=100_000))
    assert big.stopping.max_new_tokens == 3000 - big.input_length
    small = await v.validate("Hello world", P(max_new_tokens=7))
    assert small.stopping.max_new_tokens == 7


async def test_limits_fall_back_to_cache_info(tokenizer, cache_info):
    v = Validator(tokenizer, LimitsConfig(), cache_info)
    assert (v.max_input_tokens, v.max_total_tokens) == (511, 512)


async def test_greedy_defaults(validator, tokenizer):
    req = await validator.validate("Hello world", P(seed=5))
    s = req.sampling
    assert not s.do_sample and s.seed is None  # seed without sampling has no effect
    assert (s.temperature, s.top_k, s.top_p, s.typical_p) == (1.0, 0, 1.0, 1.0)
    assert (s.repetition_penalty, s.frequency_penalty, s.top_n_tokens) == (1.0, 0.0, 0)
    assert req.prompt_ids[0] == tokenizer.bos_token_id
    assert req.stopping.eos_token_ids == tokenizer.eos_token_ids
    assert not req.details and not req.return_full_text


@pytest.mark.parametrize(
    "params", [{"temperature": 0.5}, {"top_k": 3}, {"top_p": 0.9}, {"typical_p": 0.9}]
)
async def test_warpers_imply_sampling_with_a_random_seed(validator, params):
    a = await validator.validate("Hello", P(**params))
    b = await validator.validate("Hello", P(**params))
    assert a.sampling.do_sample and b.sampling.do_sample
    assert a.sampling.seed is not None and a.sampling.seed != b.sampling.seed
    assert 0 <= a.sampling.seed < 2**64


async def test_explicit_seed_and_flags(validator):
    req = await validator.validate(
        "Hello", P(do_sample=True, seed=42, decoder_input_details=True, stop=["", "x"])
    )
    assert req.sampling.seed == 42 and req.details and req.decoder_input_details
    assert req.stop_sequences == ["x"]  # empty stop strings never match
    assert not req.sampling.prefill_logprobs  # server runs without --enable-prefill-logprobs


async def test_add_special_tokens_false(validator, tokenizer):
    req = await validator.validate("Hello", P(), add_special_tokens=False)
    assert req.prompt_ids == tokenizer.encode("Hello", add_special_tokens=False).ids


async def test_tokenizer_error(validator):
    with pytest.raises(ValidationError, match="tokenizer error"):
        await validator.validate("bad \ud800 surrogate", P())


def test_best_of_pre_checks(validator, tokenizer, cache_info):
    with pytest.raises(ValidationError, match="must be > 0 and <= 2. Given: 3"):
        validator.check_best_of(P(best_of=3))
    with pytest.raises(ValidationError, match="not supported when streaming tokens"):
        validator.check_best_of(P(best_of=2), stream=True)
    with pytest.raises(ValidationError, match="`decoder_input_details` == true is not supported"):
        validator.check_best_of(P(decoder_input_details=True), stream=True)
    one = Validator(tokenizer, LimitsConfig(max_best_of=1), cache_info)
    with pytest.raises(ValidationError, match="`best_of` != 1 is not allowed for this endpoint"):
        one.check_best_of(P(best_of=2))
    assert validator.check_best_of(P(best_of=2, do_sample=True)) == 2


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        ({"type": "json", "value": {"type": "object"}}, "Grammar must have a 'properties' field"),
        ({"type": "json", "value": "{not json"}, "grammar is not valid: "),
        ({"type": "json", "value": 12}, "grammar is not supported"),
        ({"type": "regex", "value": "a(b"}, "grammar is not valid: "),
        (
            {"type": "json", "value": {"properties": {"a": {"type": "strin"}}}},
            '#/properties/a/type: "strin" is not a valid JSON type',
        ),
        ({"type": "json_schema", "value": {"name": "x"}}, "needs a `schema` object"),
    ],
)
async def test_invalid_grammars(validator, grammar, message):
    with pytest.raises(ValidationError) as info:
        await validator.validate("Hello", P(grammar=grammar))
    assert message in info.value.message


async def test_valid_grammar_is_refused_without_engine_support(validator):
    schema = {"properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for grammar in (
        {"type": "json", "value": schema},
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        {"type": "regex", "value": "[a-z]+"},
    ):
        await reject(
            validator, "Grammar is not supported by this server", grammar=GrammarParam(**grammar)
        )


async def test_grammar_disabled(tokenizer, limits, cache_info):
    v = Validator(tokenizer, limits, cache_info, disable_grammar_support=True)
    await reject(v, "grammar is not supported", grammar={"type": "regex", "value": "a"})


@pytest.fixture
def grammar_validator(tokenizer, limits, cache_info) -> Validator:
    return Validator(tokenizer, limits, cache_info, engine_supports_grammar=True)


SCHEMA = {"properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}
TYPED = {"properties": SCHEMA["properties"], "required": ["a"], "type": "object"}
IMPOSSIBLE = {"type": "integer", "minimum": 3, "maximum": 1}


@pytest.mark.parametrize(
    ("grammar", "spec"),
    [
        ({"type": "json", "value": SCHEMA}, GrammarSpec.json_schema(TYPED)),
        ({"type": "json", "value": json.dumps(SCHEMA)}, GrammarSpec.json_schema(TYPED)),
        ({"type": "json_object", "value": SCHEMA}, GrammarSpec.json_schema(TYPED)),
        ({"type": "json_object"}, GrammarSpec.json_schema({"type": "object"})),
        (
            {"type": "json_schema", "value": {"name": "n", "strict": True, "schema": SCHEMA}},
            GrammarSpec.json_schema(TYPED),
        ),
        (
            {"type": "json_schema", "json_schema": {"strict": False, "schema": SCHEMA}},
            GrammarSpec.json_schema(TYPED, strict=False),
        ),
        ({"type": "regex", "value": "[a-z]+"}, GrammarSpec.regex("[a-z]+")),
    ],
)
async def test_accepted_grammars_travel_on_the_sampling_params(grammar_validator, grammar, spec):
    req = await grammar_validator.validate("Hi", P(grammar=grammar))
    assert req.sampling.grammar == spec and req.grammar == spec
    assert req.engine_request("r1").sampling.grammar == spec  # reaches the engine request
    assert list(req.sampling.grammar.schema if spec.kind == "json" else []) == list(
        spec.schema if spec.kind == "json" else []
    )  # property order kept


def test_tgi_reads_properties_without_type_as_an_object():
    schema = {"properties": {"a": {"properties": {"b": {}}}, "c": {"anyOf": [{"properties": {}}]}}}
    typed = as_tgi_schema(schema)
    assert typed["type"] == "object"
    assert typed["properties"]["a"]["type"] == "object"
    assert typed["properties"]["c"]["anyOf"][0]["type"] == "object"
    assert "type" not in typed["properties"]["a"]["properties"]["b"]
    assert "type" not in schema  # the caller's schema is not modified


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (
            {"type": "json", "value": {"properties": {}, "uniqueItems": True}},
            'cannot compile regex from schema: Unimplemented keys: ["uniqueItems"]',
        ),
        (
            {"type": "json", "value": {"properties": {"a": IMPOSSIBLE}, "required": ["a"]}},
            "cannot compile regex from schema: Unsatisfiable schema: required property 'a'",
        ),
        (
            {"type": "json", "value": {"properties": {"a": {"$ref": "#/$defs/x"}}}},
            "cannot compile regex from schema: Pointer '/$defs/x' does not exist",
        ),
        ({"type": "regex", "value": "(?<=a)b"}, "grammar is not valid: "),
        ({"type": "regex", "value": "(a)\\1"}, "grammar is not valid: "),
        (
            {"type": "json", "value": {"properties": {"a": {"enum": ["x" * 100] * 6000}}}},
            "more than the limit of 524288",
        ),
    ],
)
async def test_grammars_the_engine_cannot_compile_are_422(grammar_validator, grammar, message):
    with pytest.raises(ValidationError) as info:
        await grammar_validator.validate("Hello", P(grammar=grammar))
    assert info.value.message.startswith("Input validation error: ")
    assert message in info.value.message and "\n" not in info.value.message
    assert info.value.status_code == 422


async def test_strict_false_ignores_what_cannot_be_enforced(grammar_validator):
    schema = {"properties": {"a": {"type": "array"}}, "uniqueItems": True}
    value = {"name": "n", "strict": False, "schema": schema}
    req = await grammar_validator.validate("Hi", P(grammar={"type": "json_schema", "value": value}))
    assert req.grammar.strict is False


async def test_disabled_grammar_wins_over_engine_support(tokenizer, limits, cache_info):
    v = Validator(
        tokenizer, limits, cache_info, disable_grammar_support=True, engine_supports_grammar=True
    )
    await reject(v, "grammar is not supported", grammar={"type": "regex", "value": "a"})


def test_params_accept_nulls_and_ignore_unknown_fields():
    p = P.model_validate({"stop": None, "details": None, "do_sample": None, "unknown": 1})
    assert p.stop == [] and p.details is False and p.do_sample is False
    assert P.when_absent().do_sample is True


async def test_validation_workers_tokenize_concurrently(tokenizer, cache_info, monkeypatch):
    """--validation-workers: prompts are tokenized on that many threads, side by side."""
    import asyncio
    import threading

    limits = LimitsConfig(validation_workers=3)
    v = Validator(tokenizer, limits, cache_info)
    barrier = threading.Barrier(3, timeout=10)  # passes only with 3 tokenizations at once
    names = set()
    encode = tokenizer.encode

    def waiting_encode(*args, **kwargs):
        names.add(threading.current_thread().name)
        barrier.wait()
        return encode(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", waiting_encode)
    await asyncio.gather(*(v.validate(f"Hello {i}", P()) for i in range(3)))
    assert len(names) == 3 and all(n.startswith("pytgi-validation") for n in names)
