"""TGI routes on a scripted router: wire shapes, headers, error mapping, health and info."""

from __future__ import annotations

import json

import pytest
from server.fakes import ScriptedInfer
from server.harness import MODEL_ID, asgi_client, scripted_app

from pytgi.errors import GenerationError, OverloadedError, ValidationError
from pytgi.server.health import Health

pytestmark = pytest.mark.anyio

TIMING_HEADERS = (
    "x-compute-type",
    "x-compute-time",
    "x-compute-characters",
    "x-total-time",
    "x-validation-time",
    "x-queue-time",
    "x-inference-time",
    "x-time-per-token",
    "x-prompt-tokens",
    "x-generated-tokens",
)


def sse_events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body (asserting the spaced framing)."""
    frames = [f for f in text.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames), frames
    return [f[len("data: ") :] for f in frames]


async def post(app, path: str, body, **kwargs):
    async with asgi_client(app) as client:
        return await client.post(path, json=body, **kwargs)


async def test_generate_returns_text_and_tgi_headers():
    response = await post(scripted_app(), "/generate", {"inputs": "Hi there", "parameters": {}})
    assert response.status_code == 200
    assert response.json() == {"generated_text": " Hello world!"}
    headers = response.headers
    assert all(h in headers for h in TIMING_HEADERS)
    assert headers["x-compute-characters"] == "8"
    assert headers["x-generated-tokens"] == "3"
    assert headers["x-total-time"] == "33"
    assert headers["x-compute-type"] == "gpu+optimized"


async def test_generate_details_shape():
    body = {"inputs": "Hi", "parameters": {"details": True, "top_n_tokens": 2, "seed": 3}}
    data = (await post(scripted_app(), "/generate", body)).json()
    details = data["details"]
    assert list(details) == [
        "finish_reason",
        "generated_tokens",
        "seed",
        "prefill",
        "tokens",
        "top_tokens",
    ]
    assert details["finish_reason"] == "length"
    assert details["tokens"][0] == {"id": 0, "text": " Hello", "logprob": -0.25, "special": False}
    assert len(details["top_tokens"]) == 3
    assert "best_of_sequences" not in details


async def test_missing_parameters_means_sampling_and_explicit_nulls_are_defaults():
    infer = ScriptedInfer()
    app = scripted_app(infer)
    await post(app, "/generate", {"inputs": "a"})
    body = {
        "inputs": "a",
        "parameters": {"details": None, "stop": None, "do_sample": None, "max_new_tokens": None},
        "unknown": 1,
    }
    response = await post(app, "/generate", body)
    assert response.status_code == 200
    assert infer.calls[0][1].do_sample is True
    assert infer.calls[1][1].do_sample is False
    assert infer.calls[1][1].stop == []


async def test_compat_route_returns_a_list_with_full_text_for_local_models():
    response = await post(scripted_app(), "/", {"inputs": "Say", "parameters": {}})
    assert response.status_code == 200
    assert response.json() == [{"generated_text": "Say Hello world!"}]
    body = {"inputs": "Say", "parameters": {"return_full_text": False}}
    assert (await post(scripted_app(), "/", body)).json() == [{"generated_text": " Hello world!"}]


async def test_generate_stream_frames():
    body = {"inputs": "Hi", "parameters": {"details": True}}
    response = await post(scripted_app(), "/generate_stream", body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["x-compute-characters"] == "2"
    events = [json.loads(e) for e in sse_events(response.text)]
    assert [e["index"] for e in events] == [1, 2, 3]
    assert events[0] == {
        "index": 1,
        "token": {"id": 1, "text": " Hello", "logprob": -0.25, "special": False},
        "generated_text": None,
        "details": None,
    }
    assert events[-1]["generated_text"] == " Hello world!"
    assert events[-1]["details"] == {
        "finish_reason": "length",
        "generated_tokens": 3,
        "seed": None,
        "input_length": 1,
    }


async def test_compat_route_streams_when_asked():
    body = {"inputs": "Hi", "parameters": {"return_full_text": False}, "stream": True}
    response = await post(scripted_app(), "/", body)
    events = [json.loads(e) for e in sse_events(response.text)]
    assert events[-1]["generated_text"] == " Hello world!"
    assert events[-1]["details"] is None


@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (ValidationError("Input validation error: `inputs` cannot be empty"), 422, "validation"),
        (OverloadedError(), 429, "overloaded"),
        (GenerationError("Request failed during generation: boom"), 424, "generation"),
    ],
)
async def test_typed_errors_map_to_tgi_status_and_body(error, status, error_type):
    infer = ScriptedInfer()
    infer.error = error
    response = await post(scripted_app(infer), "/generate", {"inputs": "x"})
    assert response.status_code == status
    assert response.json() == {"error": error.message, "error_type": error_type}
    assert ("retry-after" in response.headers) == (status == 429)
    stream = await post(scripted_app(infer), "/generate_stream", {"inputs": "x"})
    assert stream.status_code == 200
    assert [json.loads(e) for e in sse_events(stream.text)] == [response.json()]


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        (b'{"inputs":', {"content-type": "application/json"}, 400),
        (b'{"inputs": 5}', {"content-type": "application/json"}, 422),
        (b'"just a string"', {"content-type": "application/json"}, 422),
        (b"null", {"content-type": "application/json"}, 422),
        (b"[1, 2]", {"content-type": "application/json"}, 422),
        (b'{"parameters": {}}', {"content-type": "application/json"}, 422),
        (
            b'{"inputs": "x", "parameters": {"max_new_tokens": -1}}',
            {"content-type": "application/json"},
            422,
        ),
        (b'{"inputs": "x"}', {"content-type": "application/x-www-form-urlencoded"}, 415),
        (b'{"inputs": "x"}', {}, 415),
    ],
)
async def test_body_errors_are_4xx_json(content, headers, status):
    async with asgi_client(scripted_app()) as client:
        response = await client.post("/generate", content=content, headers=headers)
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error", "error_type"}
    assert "Traceback" not in body["error"] and "/work" not in body["error"]


async def test_tokenize():
    response = await post(scripted_app(), "/tokenize", {"inputs": "ab cd"})
    assert response.json() == [
        {"id": 0, "text": "ab", "start": 0, "stop": 2},
        {"id": 1, "text": "cd", "start": 3, "stop": 5},
    ]


async def test_info_reports_tgi_fields_and_cache_info():
    async with asgi_client(scripted_app()) as client:
        info = (await client.get("/info")).json()
    assert info["model_id"] == MODEL_ID
    assert info["router"] == "text-generation-router"
    assert info["version"] == "3.3.6-dev0"
    assert info["max_input_tokens"] == 500
    assert info["max_total_tokens"] == 512
    assert info["max_concurrent_requests"] == 8
    assert info["max_client_batch_size"] == 4
    assert info["max_batch_total_tokens"] == 1024
    assert info["kv_cache"]["block_size"] == 16


async def test_health_follows_state_and_engine():
    app = scripted_app()
    async with asgi_client(app) as client:
        for path in ("/health", "/", "/ping"):
            ok = await client.get(path)
            assert ok.status_code == 200 and ok.content == b""
        app.state.health.set(Health.DRAINING)
        response = await client.get("/health")
        assert response.status_code == 503
        assert response.json() == {"error": "draining", "error_type": "healthcheck"}
        refused = await client.post("/generate", json={"inputs": "x"})
        assert refused.status_code == 503
        app.state.health.set(Health.READY)
        app.state.ctx.engine.alive = False
        dead = await client.get("/health")
        assert dead.status_code == 503
        assert dead.json() == {"error": "unhealthy", "error_type": "healthcheck"}


async def test_models():
    async with asgi_client(scripted_app()) as client:
        data = (await client.get("/v1/models")).json()
    assert data == {
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": MODEL_ID}],
    }


async def test_unknown_route_and_method():
    async with asgi_client(scripted_app()) as client:
        assert (await client.get("/nope")).status_code == 404
        response = await client.get("/generate")
    assert response.status_code == 405
    assert response.json()["error_type"] == "method_not_allowed"


async def test_invocations_dispatches_on_the_body():
    app = scripted_app()
    generated = await post(app, "/invocations", {"inputs": "a", "parameters": {}})
    assert generated.json() == [{"generated_text": "a Hello world!"}]
    chat = await post(app, "/invocations", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.json()["object"] == "chat.completion"
    completion = await post(app, "/invocations", {"prompt": "a"})
    assert completion.json()["object"] == "text_completion"
    assert (await post(app, "/invocations", {"foo": 1})).status_code == 422
    assert (await post(app, "/invocations", {"inputs": 3})).status_code == 422
