"""Lone UTF-16 surrogates in every string field of every POST route: TGI's JSON reader refuses
them while reading the body (a 400 "Failed to parse the request body as JSON: ..."), so no field
(a grammar, a `response_format` or tool schema, a role, a stop sequence) can reach code that
would fail to encode it. A 5xx the server does send says `Connection: close`."""

from __future__ import annotations

import json

import httpx
import pytest
from server.fakes import ScriptedInfer
from server.harness import asgi_client, scripted_app, serve

pytestmark = pytest.mark.anyio

GRAMMAR_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "a+"}}}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": GRAMMAR_SCHEMA},
    }
]
GENERATE = {
    "inputs": "hello",
    "parameters": {
        "max_new_tokens": 2,
        "stop": ["x"],
        "adapter_id": "a",
        "grammar": {"type": "json", "value": GRAMMAR_SCHEMA},
    },
}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi", "name": "n"}],
    "stop": ["x"],
    "tools": TOOLS,
    "tool_choice": "auto",
    "tool_prompt": "p",
    "response_format": {"type": "json_object", "value": GRAMMAR_SCHEMA},
    "max_tokens": 2,
}
COMPLETIONS = {"model": "m", "prompt": ["hi", "there"], "stop": ["x"], "max_tokens": 2}
# every POST route, with a body holding as many string fields as its request type has
BODIES = {
    "/": GENERATE,
    "/generate": GENERATE,
    "/generate_stream": GENERATE,
    "/tokenize": GENERATE,
    "/v1/chat/completions": CHAT,
    "/chat_tokenize": CHAT,
    "/v1/completions": COMPLETIONS,
    "/invocations": CHAT,
    "/vertex": {"instances": [GENERATE, CHAT]},
}


def _string_paths(node, path=()):
    """Paths to every string leaf, and to every object key (as ("key", path))."""
    if isinstance(node, str):
        yield ("value", path)
    elif isinstance(node, dict):
        for key, value in node.items():
            yield ("key", (*path, key))
            yield from _string_paths(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _string_paths(value, (*path, i))


def _with_surrogate(body, kind: str, path: tuple, surrogate: str):
    copy = json.loads(json.dumps(body))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if kind == "key":
        parent[last + surrogate] = parent.pop(last)
    else:
        parent[last] = parent[last] + surrogate
    return json.dumps(copy)  # ensure_ascii: the surrogate goes out as a `\udXXX` escape


CASES = [
    (route, kind, path, surrogate)
    for route, body in BODIES.items()
    for (kind, path), surrogate in zip(
        _string_paths(body), ["\ud800", "\udfff", "\udbff", "\udc00"] * 100, strict=False
    )
]


def test_the_table_covers_every_post_route():
    from pytgi.server import completions, openai_routes, sagemaker, tgi_routes, vertex

    modules = (tgi_routes, openai_routes, completions, sagemaker, vertex)
    routes = [r for m in modules for r in m.router.routes]
    posts = {r.path for r in routes if "POST" in getattr(r, "methods", ())}
    assert posts == set(BODIES)


async def test_every_string_field_of_every_route_refuses_a_lone_surrogate():
    async with asgi_client(scripted_app()) as client:
        for route, kind, path, surrogate in CASES:
            body = _with_surrogate(BODIES[route], kind, path, surrogate)
            response = await client.post(
                route, content=body, headers={"content-type": "application/json"}
            )
            where = (route, kind, path)
            assert response.status_code == 400, (where, response.text)
            answer = response.json()
            assert answer["error_type"] == "json", where
            assert answer["error"].startswith("Failed to parse the request body as JSON: "), where
    assert len(CASES) > 80


async def test_bodies_without_surrogates_are_not_refused_by_the_parser():
    async with asgi_client(scripted_app()) as client:
        for route, body in BODIES.items():
            response = await client.post(route, json=body)
            assert response.status_code != 400 or response.json()["error_type"] != "json", route


class _Failing(ScriptedInfer):
    async def generate(self, *args, **kwargs):
        raise RuntimeError("boom")


def test_a_500_says_connection_close_and_the_pool_recovers():
    with serve(scripted_app(_Failing())) as url, httpx.Client(base_url=url, timeout=10) as client:
        failed = client.post("/generate", json={"inputs": "x"})
        assert failed.status_code == 500
        assert failed.headers["connection"] == "close"
        assert failed.json() == {"error": "Internal server error", "error_type": "internal"}
        assert client.get("/health").status_code == 200  # a fresh connection, not a dead one
