"""Infer with grammars over an engine that enforces them (the scripted engine decoding under the
real grammar engine): TGI `grammar`, chat `response_format`, tool calls for every `tool_choice`,
mixed constrained and free requests, and the grammar errors users get."""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
from fixtures.tools import CLOCK, WEATHER
from router.fake_engine import FakeEngine, constrained_script

from pytgi.config import LimitsConfig
from pytgi.errors import ValidationError
from pytgi.messages.request import FinishReason
from pytgi.router.infer import Infer
from pytgi.router.params import GenerateParameters as P
from pytgi.router.params import GrammarParam
from pytgi.router.tools import NO_TOOL

pytestmark = pytest.mark.anyio
FREE_TEXT = " The quick brown fox."
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture
def engine(tokenizer) -> FakeEngine:
    free_ids = tokenizer.encode(FREE_TEXT, add_special_tokens=False).ids
    return FakeEngine(constrained_script(tokenizer, free_ids))


@pytest.fixture
def infer(engine, tokenizer, cache_info) -> Infer:
    limits = LimitsConfig(max_input_tokens=1500, max_total_tokens=2048, max_concurrent_requests=8)
    return Infer(engine, tokenizer, limits, cache_info, engine_supports_grammar=True)


def grammar(kind: str, value) -> GrammarParam:
    return GrammarParam(type=kind, value=value)


async def test_json_grammar_output_validates(infer, engine):
    for seed in range(3):
        params = P(max_new_tokens=300, seed=seed, do_sample=True, grammar=grammar("json", PERSON))
        gen = await infer.generate("Describe someone", params)
        jsonschema.validate(json.loads(gen.generated_text), PERSON)
        assert gen.finish_reason is FinishReason.EOS_TOKEN  # the grammar's end: EOS, as TGI
    assert engine.requests[0].sampling.grammar.kind == "json"


async def test_regex_grammar_output_matches_in_full(infer):
    pattern = r"\d{3}-[A-Z]{2}( [a-z]{2,5})?"
    for seed in range(3):
        params = P(max_new_tokens=50, seed=seed, do_sample=True, grammar=grammar("regex", pattern))
        gen = await infer.generate("Code", params)
        assert re.fullmatch(pattern, gen.generated_text, flags=re.ASCII)


async def test_streamed_constrained_text_equals_the_final_text(infer):
    params = P(max_new_tokens=300, grammar=grammar("json", PERSON))
    events = [e async for e in infer.generate_stream("Describe someone", params)]
    text = "".join(e.text_delta for e in events)
    assert text == events[-1].generated_text
    jsonschema.validate(json.loads(text), PERSON)


async def test_constrained_and_free_requests_mixed(infer):
    constrained = P(max_new_tokens=300, grammar=grammar("json", PERSON))
    free = P(max_new_tokens=50)
    gens = await asyncio.gather(
        *[infer.generate("Hi", constrained if i % 2 else free) for i in range(6)]
    )
    for i, gen in enumerate(gens):
        if i % 2:
            jsonschema.validate(json.loads(gen.generated_text), PERSON)
        else:
            assert gen.generated_text == FREE_TEXT


async def test_response_format_on_chat(infer):
    fmt = GrammarParam(type="json_schema", value={"name": "person", "schema": PERSON})
    prompt = infer.render_chat(MESSAGES, response_format=fmt)
    gen = await infer.generate(prompt.text, P(max_new_tokens=300, grammar=prompt.grammar))
    jsonschema.validate(json.loads(gen.generated_text), PERSON)


@pytest.mark.parametrize(
    ("tool_choice", "names"),
    [
        ("required", {"get_weather", "get_time"}),
        ("get_weather", {"get_weather"}),
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
        ("auto", {"get_weather", "get_time", NO_TOOL}),
    ],
)
async def test_tool_calls_are_always_valid_calls(infer, tool_choice, names):
    prompt = infer.render_chat(MESSAGES, tools=[WEATHER, CLOCK], tool_choice=tool_choice)
    assert prompt.grammar is not None  # enforced, not just asked for in the prompt
    seen = set()
    for seed in range(4):
        params = P(max_new_tokens=200, seed=seed, do_sample=True, grammar=prompt.grammar)
        gen = await infer.generate(prompt.text, params)
        call = infer.parse_tool_call(gen.generated_text, prompt)
        assert call.name in names
        seen.add(call.name)
        if call.name == "get_weather":
            jsonschema.validate(call.arguments, WEATHER["function"]["parameters"])
        elif call.name == "get_time":
            assert call.arguments == {}
        else:
            assert isinstance(call.arguments["content"], str)
    assert seen <= names


async def test_tool_choice_none_has_no_grammar(infer):
    prompt = infer.render_chat(MESSAGES, tools=[WEATHER], tool_choice="none")
    assert prompt.grammar is None and not prompt.uses_tools


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"properties": {"a": {"type": "array", "uniqueItems": True}}}, "Unimplemented keys"),
        ({"properties": {"a": {"type": "stsring"}}}, "is not a valid JSON type"),
    ],
)
async def test_bad_grammars_are_422_before_the_engine(infer, engine, value, message):
    with pytest.raises(ValidationError, match=message):
        await infer.generate("Hi", P(grammar=grammar("json", value)))
    stream = infer.generate_stream("Hi", P(grammar=grammar("json", value)))
    with pytest.raises(ValidationError, match=message):  # before the first event
        await stream.__anext__()
    assert engine.requests == []


async def test_without_engine_support_grammars_are_refused(engine, tokenizer, cache_info):
    infer = Infer(engine, tokenizer, LimitsConfig(), cache_info)
    with pytest.raises(ValidationError, match="Grammar is not supported by this server"):
        await infer.generate("Hi", P(grammar=grammar("regex", "a+")))
    prompt = infer.render_chat(MESSAGES, tools=[WEATHER], tool_choice="required")
    assert prompt.grammar is None and prompt.tool_grammar is not None
