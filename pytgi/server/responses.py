"""JSON rendering shared by plain responses and SSE frames.

Compact separators and UTF-8 text as TGI sends them; NaN and infinities (a first prefill token, a
filtered top-n alternative) become `null`, which every JSON parser accepts. Pydantic wire models
are dumped in their declared field order.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(payload: Any) -> str:
    if isinstance(payload, BaseModel):
        return payload.model_dump_json()
    if isinstance(payload, list) and payload and isinstance(payload[0], BaseModel):
        return "[" + ",".join(item.model_dump_json() for item in payload) + "]"
    return json.dumps(_finite(payload), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class JSONBody(Response):
    """A JSON response rendered with `dumps`."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")
