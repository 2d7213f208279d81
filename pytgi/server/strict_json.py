"""Request bodies parsed as strict JSON, as TGI's (serde_json) extractor parses them.

Python's `json` accepts the non-standard literals `NaN`, `Infinity` and `-Infinity`; TGI answers
them with 400 (not valid JSON), and a `temperature` of `Infinity` must never reach validation.
It also accepts a lone UTF-16 surrogate escape (`"\\ud800"` without its pair), which no UTF-8
string can hold: serde_json refuses it while reading the body, so TGI answers 400 "Failed to parse
the request body as JSON: ..." and so does pytgi (a surrogate must never reach a grammar, a
tokenizer or a log line, where encoding it fails).
Every route module builds its `APIRouter(route_class=StrictJSONRoute)`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


def _reject_constant(name: str) -> Any:
    # FastAPI turns a JSONDecodeError into a 400 `json` error (server/errors.py)
    raise json.JSONDecodeError(f"{name} is not a valid JSON value", name, 0)


def _has_lone_surrogate(text: str) -> bool:
    # a paired escape decodes to one code point above U+FFFF: any U+D800-U+DFFF left is lone
    return any("\ud800" <= ch <= "\udfff" for ch in text)


def reject_lone_surrogates(value: Any) -> None:
    """Raise a JSONDecodeError when any string (key or value) of `value` holds a lone surrogate."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _has_lone_surrogate(node):
                raise json.JSONDecodeError("lone leading or trailing surrogate in a string", "", 0)
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def loads_strict(body: bytes | str) -> Any:
    """`body` as TGI's JSON extractor reads it, or a JSONDecodeError."""
    try:
        value = json.loads(body, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:  # not UTF-8: serde_json refuses it while reading too
        raise json.JSONDecodeError(f"invalid UTF-8 ({exc.reason})", "", exc.start) from None
    reject_lone_surrogates(value)
    return value


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
