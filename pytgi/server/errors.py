"""Errors → HTTP: TGI's status codes and `{"error", "error_type"}` bodies (TGI_COMPATIBILITY.md §4).

Typed `PytgiError`s carry their own status and `error_type`. Body problems never reach a route:
unreadable JSON → 400, a body of the wrong shape → 422, a non-JSON content type → 415 (TGI's
JSON extractor answers the same statuses as plain text; we keep the JSON shape clients parse).
Nothing here puts a traceback, a path or a secret in a body; unexpected exceptions are logged.
Bodies are `JSONBody`, which encodes messages echoing a client's lone surrogates (U+FFFD).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from pytgi.errors import OverloadedError, PytgiError
from pytgi.server.disconnect import ClientDisconnected, on_client_disconnected
from pytgi.server.responses import JSONBody
from pytgi.server.sse import DONE, data_frame

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # sent with 429: the openai client waits this long before its retries


_LOGGED_CHARS = 300  # of an error message in the log (messages may echo client input)


def log_error(where: str, status: int, message: str, error_type: str) -> None:
    """One log line per refused or failed request, with TGI's status and reason (TGI logs them
    too): INFO for a client's mistake (4xx), ERROR for the server's (5xx)."""
    level = logging.ERROR if status >= 500 else logging.INFO
    logger.log(level, "%s: %d %s: %s", where, status, error_type, message[:_LOGGED_CHARS])


def error_body(message: str, error_type: str) -> dict[str, str]:
    return {"error": message, "error_type": error_type}


def error_response(status: int, message: str, error_type: str, **headers: str) -> JSONBody:
    return JSONBody(error_body(message, error_type), status_code=status, headers=headers)


def pytgi_error_response(exc: PytgiError) -> JSONBody:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, OverloadedError) else {}
    return error_response(exc.status_code, exc.message, exc.error_type, **headers)


def openai_stream_error(exc: PytgiError) -> dict[str, Any]:
    """TGI's in-stream error event on the OpenAI routes: always `http_status_code: 422`."""
    return {"error": {"message": exc.message, "http_status_code": 422}}


def _location(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def describe_validation_errors(errors: list[dict[str, Any]]) -> str:
    """`loc: message` pairs, like serde's `Failed to deserialize…` text, without echoing input."""
    described = "; ".join(f"{_location(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in errors)
    return f"Failed to deserialize the JSON body into the target type: {described}"


def _is_json_content_type(request: Request) -> bool:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return content_type == "application/json" or content_type.endswith("+json")


def _body_error(exc: RequestValidationError, request: Request) -> tuple[int, str, str]:
    if request.method == "POST" and not _is_json_content_type(request):
        message = "Expected request with `Content-Type: application/json`"
        return 415, message, "unsupported_media_type"
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "invalid JSON")
        return 400, f"Failed to parse the request body as JSON: {detail}", "json"
    return 422, describe_validation_errors(errors), "validation"


async def _on_request_validation(request: Request, exc: RequestValidationError) -> JSONBody:
    status, message, error_type = _body_error(exc, request)
    log_error(request.url.path, status, message, error_type)
    return error_response(status, message, error_type)


async def _on_pytgi_error(request: Request, exc: PytgiError) -> JSONBody:
    log_error(request.url.path, exc.status_code, exc.message, exc.error_type)
    return pytgi_error_response(exc)


async def _on_http_exception(request: Request, exc: HTTPException) -> JSONBody:
    message = exc.detail if isinstance(exc.detail, str) else "Request error"
    error_type = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http")
    return error_response(exc.status_code, message, error_type, **(exc.headers or {}))


async def _on_unexpected(request: Request, exc: Exception) -> JSONBody:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, "Internal server error", "internal")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ClientDisconnected, on_client_disconnected)
    app.add_exception_handler(RequestValidationError, _on_request_validation)
    app.add_exception_handler(PytgiError, _on_pytgi_error)
    app.add_exception_handler(HTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)


async def openai_event_stream(frames: AsyncIterator[str], label: str) -> AsyncIterator[str]:
    """Frame an OpenAI stream: errors become one error event, and `data: [DONE]` always ends it."""
    try:
        async for frame in frames:
            yield frame
    except PytgiError as exc:
        log_error(f"{label} stream", exc.status_code, exc.message, exc.error_type)
        yield data_frame(openai_stream_error(exc))
    except Exception:
        logger.exception("%s stream failed", label)
        yield data_frame(openai_stream_error(PytgiError("Internal server error")))
    finally:
        await frames.aclose()
    yield DONE
