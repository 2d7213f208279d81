"""Request bodies parsed as strict JSON, as TGI's (serde_json) extractor parses them.

Python's `json` accepts the non-standard literals `NaN`, `Infinity` and `-Infinity`; TGI answers
them with 400 (not valid JSON), and a `temperature` of `Infinity` must never reach validation.
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


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = json.loads(await self.body(), parse_constant=_reject_constant)
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
