"""`/v1/chat/completions` and `/chat_tokenize` on a scripted router: bodies, chunks, tools."""

from __future__ import annotations

import json

import pytest
from server.fakes import ScriptedInfer
from server.harness import MODEL_ID, asgi_client, scripted_app

from pytgi.errors import OverloadedError, TemplateError

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
TOOL_TEXT = ['{"function": {"_name": "get_weather", ', '"location": ', '"Paris"', "}}"]


async def post(app, body):
    async with asgi_client(app) as client:
        return await client.post("/v1/chat/completions", json=body)


def events(text: str) -> list:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_chat_completion_body():
    response = await post(scripted_app(), {"model": "tgi", "messages": MESSAGES})
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == MODEL_ID
    assert data["system_fingerprint"] == "3.3.6-dev0-native"
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " Hello world!"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert data["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert "x-generated-tokens" in response.headers


async def test_chat_parameter_mapping():
    infer = ScriptedInfer()
    body = {
        "messages": MESSAGES,
        "temperature": 0,
        "max_completion_tokens": 2,
        "presence_penalty": 0.5,
        "stop": "\n",
        "top_logprobs": 2,
        "stream_options": None,
        "ignore_eos": True,
        "n": 1,
    }
    assert (await post(scripted_app(infer), body)).status_code == 200
    _, params = infer.calls[0]
    assert params.do_sample is False and params.temperature is None
    assert params.max_new_tokens == 2
    assert params.repetition_penalty == 2.5
    assert params.stop == ["\n"]
    assert params.top_n_tokens == 2
    await post(scripted_app(infer), {"messages": MESSAGES, "temperature": 0.7})
    assert infer.calls[1][1].do_sample is True and infer.calls[1][1].temperature == 0.7


async def test_chat_logprobs():
    body = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2, "max_tokens": 1}
    data = (await post(scripted_app(), body)).json()
    assert data["choices"][0]["logprobs"] == {
        "content": [
            {
                "token": " Hello",
                "logprob": -0.25,
                "top_logprobs": [
                    {"token": " Hello", "logprob": -0.25},
                    {"token": " alt", "logprob": -2.0},
                ],
            }
        ]
    }


async def test_chat_stream_with_usage():
    body = {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    response = await post(scripted_app(), body)
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": " Hello", "tool_calls": None}
    assert "".join(d["content"] for d in deltas) == " Hello world!"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


async def test_chat_stream_without_usage_and_with_logprobs():
    body = {"messages": MESSAGES, "stream": True, "logprobs": True}
    chunks = events((await post(scripted_app(), body)).text)
    assert len(chunks) == 3
    assert chunks[0]["choices"][0]["logprobs"]["content"][0]["token"] == " Hello"


async def test_errors_before_streaming_are_http_errors_and_later_ones_are_events():
    infer = ScriptedInfer()
    infer.render_chat = _raise(TemplateError("Template error: template not found"))
    response = await post(scripted_app(infer), {"messages": MESSAGES, "stream": True})
    assert response.status_code == 422
    assert response.json() == {
        "error": "Template error: template not found",
        "error_type": "template_error",
    }
    infer = ScriptedInfer()
    infer.error = OverloadedError()
    response = await post(scripted_app(infer), {"messages": MESSAGES, "stream": True})
    assert response.status_code == 200
    assert events(response.text) == [
        {"error": {"message": "Model is overloaded", "http_status_code": 422}}
    ]


async def test_tool_call_non_stream():
    infer = ScriptedInfer(TOOL_TEXT)
    body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 4}
    message = (await post(scripted_app(infer), body)).json()["choices"][0]["message"]
    assert message == {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "0",
                "type": "function",
                "function": {
                    "description": None,
                    "name": "get_weather",
                    "arguments": '{"location": "Paris"}',
                },
            }
        ],
    }


async def test_tool_call_stream_accumulates_to_the_arguments():
    infer = ScriptedInfer(TOOL_TEXT)
    body = {
        "messages": MESSAGES,
        "tools": TOOLS,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = events((await post(scripted_app(infer), body)).text)
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"]]
    assert calls[0]["function"]["name"] == "get_weather"
    assert all(c["function"]["name"] is None for c in calls[1:])
    assert len({c["id"] for c in calls}) == 1
    arguments = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(arguments) == {"location": "Paris"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_no_tool_answer_reruns_without_tools():
    no_tool = ['{"function": {"_name": "no_tool", "content": "x"}}']
    for stream in (False, True):
        infer = ScriptedInfer(no_tool)
        body = {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 1, "stream": stream}
        response = await post(scripted_app(infer), body)
        assert len(infer.calls) == 2
        if stream:
            content = "".join(c["choices"][0]["delta"]["content"] for c in events(response.text))
        else:
            content = response.json()["choices"][0]["message"]["content"]
        assert content == no_tool[0]  # the scripted router answers with the same text


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "json_object", "value": {"properties": {}}}, ("json_object", {"properties": {}})),
        ({"type": "json_object"}, ("json_object", None)),
        (
            {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
            ("json_schema", {"name": "w", "schema": {"type": "object"}}),
        ),
        ({"type": "regex", "value": "[0-9]+"}, ("regex", "[0-9]+")),
        ({"type": "text"}, None),
    ],
)
async def test_response_format_shapes(response_format, expected):
    infer = ScriptedInfer()
    body = {"messages": MESSAGES, "response_format": response_format}
    assert (await post(scripted_app(infer), body)).status_code == 200
    grammar = infer.calls[0][1].grammar
    assert (grammar.type, grammar.value) == expected if expected else grammar is None


async def test_bad_response_format_is_422():
    body = {"messages": MESSAGES, "response_format": {"type": "yaml"}}
    response = await post(scripted_app(), body)
    assert response.status_code == 422
    assert response.json()["error_type"] == "validation"


async def test_message_forms_are_accepted():
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "7", "extra": 1},
    ]
    assert (await post(scripted_app(), {"messages": messages})).status_code == 200


async def test_chat_tokenize():
    async with asgi_client(scripted_app()) as client:
        response = await client.post("/chat_tokenize", json={"messages": MESSAGES})
    data = response.json()
    assert data["templated_text"] == "<|user|>Hi\n<|assistant|>\n"
    assert data["tokenize_response"][0] == {
        "id": 0,
        "text": "<|user|>Hi\n<|assistant|>\n",
        "start": 0,
        "stop": 25,
    }


def _raise(exc):
    def render(*args, **kwargs):
        raise exc

    return render
