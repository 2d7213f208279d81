"""Constrained output through the HTTP server with real clients (openai, huggingface_hub,
text-generation), over an engine that enforces grammars (the scripted engine decoding under the
real grammar engine): JSON schemas, regexes, response_format, tools with streamed tool_calls,
and grammar errors as TGI reports them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import httpx
import jsonschema
import openai
import pytest
import text_generation
from fixtures.tools import WEATHER
from huggingface_hub import InferenceClient
from router.fake_engine import FakeEngine, constrained_script
from server.fakes import CACHE_INFO
from server.harness import MODEL_ID, serve, server_config

from pytgi.router.infer import Infer
from pytgi.server.app import create_app

FREE_TEXT = " Just text."
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Hi"}]
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


@pytest.fixture(scope="module")
def url(tokenizer):
    free_ids = tokenizer.encode(FREE_TEXT, add_special_tokens=False).ids
    engine = FakeEngine(constrained_script(tokenizer, free_ids))
    config = server_config()
    cache = replace(CACHE_INFO, max_total_tokens=2048, max_input_tokens=1800)  # tool prompts
    infer = Infer(engine, tokenizer, config.limits, cache, engine_supports_grammar=True)
    app = create_app(infer, engine, config, cache, model_info={"model_id": MODEL_ID})
    with serve(app) as base_url:
        yield base_url


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="-")


def test_text_generation_client_json_and_regex(url):
    client = text_generation.Client(url)
    json_grammar = text_generation.types.Grammar(
        type=text_generation.types.GrammarType.Json, value=PERSON
    )
    response = client.generate("Someone", max_new_tokens=100, grammar=json_grammar)
    jsonschema.validate(json.loads(response.generated_text), PERSON)
    regex = text_generation.types.Grammar(type=text_generation.types.GrammarType.Regex, value=PHONE)
    events = list(client.generate_stream("Call", max_new_tokens=40, grammar=regex))
    assert re.fullmatch(PHONE, events[-1].generated_text, flags=re.ASCII)
    assert events[-1].details.finish_reason.value == "eos_token"


def test_inference_client_text_generation_and_tools(url, hub_online):
    client = InferenceClient(url)
    text = client.text_generation(
        "Someone",
        max_new_tokens=100,
        grammar={"type": "json", "value": PERSON},
        return_full_text=False,  # `POST /` defaults to the full text for text-generation models
    )
    jsonschema.validate(json.loads(text), PERSON)
    out = client.chat_completion(
        MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=120, seed=1
    )
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = call.function.arguments
    arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])


@pytest.mark.parametrize("stream", [False, True])
def test_openai_response_format_json_schema(url, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": PERSON}}
    client = openai_client(url)
    kwargs = dict(model="tgi", messages=MESSAGES, response_format=fmt, max_tokens=100, seed=3)
    if stream:
        chunks = client.chat.completions.create(stream=True, **kwargs)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        text = client.chat.completions.create(**kwargs).choices[0].message.content
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_tool_calls_are_valid_calls(url, stream):
    client = openai_client(url)
    kwargs = dict(
        model="tgi", messages=MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=120
    )
    for seed in range(3):
        if stream:
            name, arguments = None, ""
            for chunk in client.chat.completions.create(stream=True, seed=seed, **kwargs):
                for delta in chunk.choices[0].delta.tool_calls or []:
                    name = delta.function.name or name
                    arguments += delta.function.arguments or ""
        else:
            message = client.chat.completions.create(seed=seed, **kwargs).choices[0].message
            name, arguments = (
                message.tool_calls[0].function.name,
                message.tool_calls[0].function.arguments,
            )
        assert name == "get_weather"
        jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_openai_tool_choice_auto_answers_with_a_call_or_text(url):
    client = openai_client(url)
    outcomes = set()
    for seed in range(6):
        message = (
            client.chat.completions.create(
                model="tgi", messages=MESSAGES, tools=[WEATHER], max_tokens=120, seed=seed
            )
            .choices[0]
            .message
        )
        if message.tool_calls:
            args = json.loads(message.tool_calls[0].function.arguments)
            jsonschema.validate(args, WEATHER["function"]["parameters"])
            outcomes.add("call")
        else:
            assert message.content == FREE_TEXT  # no_tool: re-run without tools, as TGI
            outcomes.add("text")
    assert outcomes


def test_openai_completions_response_format(url):
    client = openai_client(url)
    out = client.completions.create(
        model="tgi",
        prompt="Someone",
        max_tokens=100,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}},
    )
    jsonschema.validate(json.loads(out.choices[0].text), PERSON)


def test_grammar_errors_as_tgi_reports_them(url):
    bad = {"type": "json", "value": {"properties": {"a": {"type": "array", "uniqueItems": True}}}}
    body = {"inputs": "Hi", "parameters": {"grammar": bad}}
    expected = 'cannot compile regex from schema: Unimplemented keys: ["uniqueItems"]'
    with httpx.Client(base_url=url, timeout=30) as http:
        response = http.post("/generate", json=body)
        assert response.status_code == 422
        assert response.json() == {
            "error": f"Input validation error: {expected}",
            "error_type": "validation",
        }
        stream = http.post("/generate_stream", json=body)
        assert stream.status_code == 200  # TGI: a stream reports validation errors as an event
        assert json.loads(stream.text.removeprefix("data:"))["error_type"] == "validation"
        chat = http.post(
            "/v1/chat/completions",
            json={"messages": MESSAGES, "response_format": bad, "max_tokens": 10},
        )
        assert chat.status_code == 422 and expected in chat.json()["error"]
        both = http.post(
            "/v1/chat/completions",
            json={"messages": MESSAGES, "response_format": bad, "tools": []},
        )
        assert both.json()["error"] == "Tool error: Grammar and tools are mutually exclusive"
        assert http.post("/generate", json={"inputs": "Hi"}).status_code == 200  # still serving
