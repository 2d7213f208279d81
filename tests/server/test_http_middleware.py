"""API key, payload limit (also chunked bodies without Content-Length) and CORS."""

from __future__ import annotations

import socket

import pytest
from server.harness import asgi_client, scripted_app, serve

from pytgi.config import LimitsConfig

pytestmark = pytest.mark.anyio

KEY = "s3cret-key"
PROTECTED = [
    "/",
    "/generate",
    "/generate_stream",
    "/v1/chat/completions",
    "/v1/completions",
    "/tokenize",
    "/invocations",
]


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong",
        f"bearer {KEY}",
        f"Bearer {KEY.upper()}",
        f"Basic {KEY}",
        KEY,
        f"Bearer {KEY} ",
    ],
)
async def test_the_key_must_match_exactly(authorization):
    headers = {"authorization": authorization} if authorization else {}
    async with asgi_client(scripted_app(api_key=KEY)) as client:
        response = await client.post("/generate", json={"inputs": "x"}, headers=headers)
    assert response.status_code == 401
    assert response.content == b""


async def test_every_protected_route_needs_the_key():
    async with asgi_client(scripted_app(api_key=KEY)) as client:
        for path in PROTECTED:
            response = await client.post(path, json={"inputs": "x"}, headers={})
            assert response.status_code == 401, path
            wrong = await client.post(path, json={}, headers={"authorization": "Bearer no"})
            assert wrong.status_code == 401, path


async def test_right_key_passes_and_open_routes_stay_open():
    async with asgi_client(scripted_app(api_key=KEY)) as client:
        ok = await client.post(
            "/generate", json={"inputs": "x"}, headers={"authorization": f"Bearer {KEY}"}
        )
        assert ok.status_code == 200
        for path in ("/health", "/info", "/metrics", "/v1/models", "/docs"):
            assert (await client.get(path)).status_code == 200, path
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post("/chat_tokenize", json=chat)).status_code == 200


async def test_duplicate_authorization_headers_are_refused():
    headers = [("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {KEY}")]
    async with asgi_client(scripted_app(api_key=KEY)) as client:
        response = await client.post("/generate", json={"inputs": "x"}, headers=headers)
    assert response.status_code == 401


async def test_auth_comes_before_body_parsing():
    async with asgi_client(scripted_app(api_key=KEY)) as client:
        response = await client.post("/generate", content=b"{not json")
    assert response.status_code == 401


async def test_payload_limit_with_content_length():
    async with asgi_client(scripted_app(limits=LimitsConfig(payload_limit=100))) as client:
        small = await client.post("/generate", json={"inputs": "x"})
        big = await client.post("/generate", json={"inputs": "x" * 200})
    assert small.status_code == 200
    assert big.status_code == 413
    assert big.json()["error_type"] == "payload_too_large"


async def test_payload_limit_on_chunked_body():
    async def chunks():
        yield b'{"inputs": "'
        for _ in range(50):
            yield b"x" * 10
        yield b'"}'

    async with asgi_client(scripted_app(limits=LimitsConfig(payload_limit=100))) as client:
        response = await client.post(
            "/generate", content=chunks(), headers={"content-type": "application/json"}
        )
    assert response.status_code == 413


def test_payload_limit_over_the_wire_without_content_length():
    """A raw chunked upload to uvicorn: 413 arrives before the client finishes sending."""
    with serve(scripted_app(limits=LimitsConfig(payload_limit=1000))) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            chunk = b"x" * 600
            for _ in range(3):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413")


async def test_cors_defaults_to_any_origin_and_honours_the_flag():
    preflight = {"origin": "https://a.example", "access-control-request-method": "POST"}
    async with asgi_client(scripted_app()) as client:
        response = await client.options("/generate", headers=preflight)
    assert response.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in response.headers
    app = scripted_app(cors_allow_origin=("https://b.example",))
    async with asgi_client(app) as client:
        denied = await client.options("/generate", headers=preflight)
        allowed = await client.get("/info", headers={"origin": "https://b.example"})
    assert denied.status_code == 400
    assert allowed.headers["access-control-allow-origin"] == "https://b.example"
