"""LangChain's OpenAI chat model (`langchain_openai.ChatOpenAI` with `base_url`) on the real server:
structured output by each of its methods (`json_schema` strict, `json_mode`, `function_calling`)
and tool binding, plain and streamed. LangChain builds the requests itself (tool_choice shapes,
`strict`, `parallel_tool_calls`) and parses the answers with its own parsers, so this checks
what a LangChain user gets, not only the wire format."""

from __future__ import annotations

import json

import jsonschema
import langchain_openai
import pytest

from e2e.test_grammar import CLOCK, PERSON, WEATHER, valid_call

QUESTION = "What is the weather in Paris?"


def chat_model(url: str, **kwargs):
    return langchain_openai.ChatOpenAI(
        base_url=f"{url}/v1", api_key="-", model="tgi", max_tokens=120, timeout=120, **kwargs
    )


def test_structured_output_json_schema_strict(pytgi_server_url):
    schema = {"title": "person", "description": "A person", **PERSON}
    runnable = chat_model(pytgi_server_url, seed=1).with_structured_output(
        schema, method="json_schema", strict=True
    )
    jsonschema.validate(runnable.invoke("Someone"), PERSON)


def test_structured_output_json_mode(pytgi_server_url):
    runnable = chat_model(pytgi_server_url, temperature=0).with_structured_output(
        method="json_mode"
    )
    assert isinstance(runnable.invoke("Someone, as JSON"), dict)


def test_structured_output_by_function_calling(pytgi_server_url):
    schema = {"title": "person", "description": "A person", **PERSON}
    runnable = chat_model(pytgi_server_url, seed=2).with_structured_output(
        schema, method="function_calling"
    )
    jsonschema.validate(runnable.invoke("Someone"), PERSON)


@pytest.mark.parametrize("choice", ["required", "get_weather", "any"])
def test_bound_tools_give_valid_calls(pytgi_server_url, choice):
    model = chat_model(pytgi_server_url, seed=3).bind_tools([WEATHER, CLOCK], tool_choice=choice)
    message = model.invoke(QUESTION)
    (call,) = message.tool_calls
    assert choice in ("required", "any") or call["name"] == choice
    valid_call(call["name"], call["args"])


def test_bound_tools_streamed(pytgi_server_url):
    model = chat_model(pytgi_server_url, seed=4).bind_tools([WEATHER], tool_choice="get_weather")
    merged = None
    for chunk in model.stream(QUESTION):
        merged = chunk if merged is None else merged + chunk
    (call,) = merged.tool_calls
    assert call["name"] == "get_weather"
    valid_call("get_weather", json.dumps(call["args"]))
