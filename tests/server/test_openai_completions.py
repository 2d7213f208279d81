"""`/v1/completions` on a scripted router: one or several prompts, streams, TGI's checks."""

from __future__ import annotations

import json

import pytest
from server.fakes import ScriptedInfer
from server.harness import asgi_client, scripted_app

from pytgi.errors import ValidationError

pytestmark = pytest.mark.anyio


async def post(app, body):
    async with asgi_client(app) as client:
        return await client.post("/v1/completions", json=body)


def events(text: str) -> list:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_single_prompt():
    response = await post(scripted_app(), {"model": "tgi", "prompt": "Once upon", "max_tokens": 3})
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["choices"] == [
        {"index": 0, "text": " Hello world!", "logprobs": None, "finish_reason": "length"}
    ]
    assert data["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert response.headers["x-compute-characters"] == "9"


async def test_several_prompts_sum_usage_and_headers():
    infer = ScriptedInfer()
    body = {"prompt": ["a", "b c", "d"], "max_tokens": 2, "temperature": 0}
    response = await post(scripted_app(infer), body)
    data = response.json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    assert response.headers["x-generated-tokens"] == "6"
    assert all(params.do_sample is False for _, params in infer.calls)


async def test_stream_interleaves_prompts_and_ends_each_with_usage():
    body = {"prompt": ["a", "b"], "max_tokens": 2, "stream": True}
    chunks = events((await post(scripted_app(ScriptedInfer(delay_s=0.01)), body)).text)
    by_index: dict[int, list] = {0: [], 1: []}
    for chunk in chunks:
        by_index[chunk["choices"][0]["index"]].append(chunk)
    for index in (0, 1):
        first, last = by_index[index]
        assert first["choices"][0]["finish_reason"] == ""
        assert "usage" not in first
        assert last["choices"][0]["finish_reason"] == "length"
        assert last["usage"] == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        assert first["choices"][0]["text"] + last["choices"][0]["text"] == " Hello world"


@pytest.mark.parametrize(
    ("body", "error_type"),
    [
        ({"prompt": "a", "suffix": "z"}, "suffix not supported"),
        ({"prompt": []}, "empty input"),
        ({"prompt": ["a"] * 5}, "batch size exceeded"),
    ],
)
async def test_request_level_checks(body, error_type):
    response = await post(scripted_app(), body)
    assert response.status_code == 422
    assert response.json()["error_type"] == error_type


async def test_errors():
    infer = ScriptedInfer()
    infer.error = ValidationError("Input validation error: `top_p` must be > 0.0 and < 1.0")
    response = await post(scripted_app(infer), {"prompt": ["a", "b"]})
    assert response.status_code == 422
    assert response.json()["error"].startswith("Input validation error")
    stream = await post(scripted_app(infer), {"prompt": "a", "stream": True})
    assert events(stream.text) == [
        {"error": {"message": infer.error.message, "http_status_code": 422}}
    ]
