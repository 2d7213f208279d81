"""Over real HTTP (uvicorn on 127.0.0.1): keep-alive comments, and client disconnects that stop
the router stream, abort the engine request and release the concurrency permit."""

from __future__ import annotations

import time

import httpx
import pytest
from server.fakes import ScriptedInfer
from server.harness import scripted_app, serve

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 400, "stream": True}
STREAMS = [
    ("/generate_stream", {"inputs": "a", "parameters": {"max_new_tokens": 400}}),
    ("/", {"inputs": "a", "parameters": {"max_new_tokens": 400}, "stream": True}),
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 400, "stream": True}),
]
NON_STREAMS = [
    ("/generate", {"inputs": "a", "parameters": {"max_new_tokens": 400}}),
    ("/v1/chat/completions", {**CHAT, "stream": False}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 400}),
]


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_keep_alive_comments_while_idle():
    app = scripted_app(ScriptedInfer([" a", " b"], delay_s=0.3), keep_alive_s=0.1)
    with serve(app) as url:
        response = httpx.post(f"{url}/generate_stream", json={"inputs": "x"}, timeout=10)
    assert ":\n\n" in response.text
    assert response.text.count("data: ") == 2


@pytest.mark.parametrize(("path", "body"), STREAMS)
def test_stream_disconnect_aborts_the_engine_request(real_app, engine_factory, path, body):
    app, engine = real_app(engine_factory(eos=False, delay_s=0.02))
    infer = app.state.ctx.infer
    with serve(app) as url:
        with httpx.Client(timeout=10) as client:
            with client.stream("POST", f"{url}{path}", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
        wait_until(lambda: engine.requests and not engine.active)
        assert {r.request_id for r in engine.requests} <= engine.aborted
        wait_until(lambda: infer.num_in_flight == 0)
        follow_up = httpx.post(
            f"{url}/generate", json={"inputs": "a", "parameters": {"max_new_tokens": 2}}
        )
    assert follow_up.status_code == 200


@pytest.mark.parametrize(("path", "body"), NON_STREAMS)
def test_non_stream_disconnect_aborts_the_engine_request(real_app, engine_factory, path, body):
    app, engine = real_app(engine_factory(eos=False, delay_s=0.02))
    with serve(app) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}{path}", json=body, timeout=0.3)
        wait_until(lambda: engine.requests and not engine.active)
    assert engine.aborted == {r.request_id for r in engine.requests}
    assert app.state.ctx.infer.num_in_flight == 0
    assert app.state.health.num_inflight == 0
