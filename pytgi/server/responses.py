"""JSON rendering shared by plain responses and SSE frames.

Compact separators and UTF-8 text as TGI sends them; NaN and infinities (a first prefill token, a
filtered top-n alternative) become `null`, which every JSON parser accepts. Pydantic wire models
and dataclasses are dumped in their declared field order.

A JSON string may carry a lone UTF-16 surrogate (`"\\ud800"`), which Python decodes into a `str`
that UTF-8 cannot encode; an error message that echoes it (a role, a tool name) must still be
sent. `encode_utf8` and `dumps` turn such surrogates into U+FFFD, so every body and SSE frame
encodes whatever the client sent.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic_core import PydanticSerializationError
from starlette.responses import Response

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT_CHARACTER = "\ufffd"


def without_surrogates(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD (a no-op for ordinary text)."""
    return _LONE_SURROGATE.sub(REPLACEMENT_CHARACTER, text)


def encode_utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return without_surrogates(text).encode("utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


@functools.cache
def _adapter(kind: type) -> TypeAdapter:
    return TypeAdapter(kind)


def _is_wire(value: Any) -> bool:
    """A pydantic model or dataclass (the router's result types are pydantic dataclasses)."""
    return isinstance(value, BaseModel) or is_pydantic_dataclass(type(value))


def _dump_wire(value: Any, kind: type) -> str:
    adapter = _adapter(kind)
    try:
        return adapter.dump_json(value).decode()
    except PydanticSerializationError:  # a lone surrogate in a string field
        return without_surrogates(_json(adapter.dump_python(value)))


def _json(payload: Any) -> str:
    return json.dumps(_finite(payload), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(payload: Any) -> str:
    """Compact JSON text; it may hold lone surrogates: encode it with `encode_utf8`."""
    if _is_wire(payload):
        return _dump_wire(payload, type(payload))
    if isinstance(payload, list) and payload and _is_wire(payload[0]):
        return _dump_wire(payload, list[type(payload[0])])
    return _json(payload)


class JSONBody(Response):
    """A JSON response rendered with `dumps`."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_utf8(dumps(content))
