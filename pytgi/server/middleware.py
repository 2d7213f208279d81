"""ASGI middleware: API key, request body limit and the drain gate.

All of them decide on the raw ASGI `scope` (method and `scope["path"]`, the path the router will
match), never on a URL rebuilt from the `Host` header (CVE-2026-48746).

- `ApiKeyMiddleware`: with `--api-key`, every POST except `/chat_tokenize` (TGI_COMPATIBILITY.md
  §3) needs the header `Authorization: Bearer <key>`, compared exactly and in constant time; else a
  bare 401.
- `GateMiddleware`: counts in-flight POSTs for the graceful drain and answers 503 to new ones while
  the server is not `ready`.
- `TracingMiddleware`: with `--otlp-endpoint`, one OpenTelemetry span per request
  (utils/tracing.py), current while the app runs, so a stream's phases become its children.
- `BodyLimitMiddleware`: `--payload-limit`: 413 as soon as `Content-Length` or the bytes read so
  far (chunked bodies too) exceed the limit; the accepted body is replayed to the app.
- `CloseOn5xx` (outermost, around Starlette's own error middleware): every 5xx response says
  `Connection: close`. Starlette re-raises an unexpected exception after its 500 has been sent and
  uvicorn then closes the connection; without the header a pooled keep-alive client would send its
  next, unrelated request on a dead connection and get an empty reply.
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pytgi.server.health import HealthState
from pytgi.utils import tracing

UNPROTECTED_POST_PATHS = frozenset({"/chat_tokenize"})


async def _send_status(send: Send, status: int, body: bytes = b"", headers=()) -> None:
    raw = [(b"content-length", str(len(body)).encode())]
    if body:
        raw.append((b"content-type", b"application/json"))
    raw.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _json_error(message: str, error_type: str) -> bytes:
    return json.dumps({"error": message, "error_type": error_type}).encode()


def _is_post(scope: Scope) -> bool:
    return scope["type"] == "http" and scope["method"] == "POST"


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if _is_post(scope) and scope["path"] not in UNPROTECTED_POST_PATHS:
            if not self._authorized(scope):
                await _send_status(send, 401)
                return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        values = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(values) != 1:
            return False
        return hmac.compare_digest(values[0], self.expected)


class GateMiddleware:
    def __init__(self, app: ASGIApp, health: HealthState):
        self.app = app
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_post(scope):
            await self.app(scope, receive, send)
            return
        if not self.health.accepting:
            body = _json_error(f"Server is {self.health.status.value}", "unavailable")
            await _send_status(send, 503, body, [(b"retry-after", b"1")])
            return
        self.health.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            self.health.request_finished()


class TracingMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status = 500  # unless a response starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with tracing.request_span(scope["method"], scope["path"], headers) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                tracing.end_request_span(span, status)


class PayloadTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit_bytes: int):
        self.app = app
        self.limit_bytes = limit_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        try:
            self._check_content_length(scope)
            body, more = await self._read_body(receive)
        except PayloadTooLarge:
            message = f"Request body exceeds the payload limit of {self.limit_bytes} bytes"
            await _send_status(send, 413, _json_error(message, "payload_too_large"))
            return
        await self.app(scope, _replay(body, more, receive), send)

    def _check_content_length(self, scope: Scope) -> None:
        for key, value in scope["headers"]:
            if key == b"content-length" and value.isdigit() and int(value) > self.limit_bytes:
                raise PayloadTooLarge

    async def _read_body(self, receive: Receive) -> tuple[bytes, Message | None]:
        """The whole body; or, if the client left first, what came and the disconnect message."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit_bytes:
                raise PayloadTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


def _replay(body: bytes, pending: Message | None, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if pending is not None:
            return pending
        return await receive()

    return replay


class CloseOn5xx:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 500:
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"
                ]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)
