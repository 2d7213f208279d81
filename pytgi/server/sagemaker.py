"""SageMaker's `POST /invocations` (TGI_COMPATIBILITY.md §3): one route for the three request kinds.

Like TGI's untagged enum, the body is tried as a generate request (`inputs`), then a chat request
(`messages`), then a completions request (`prompt`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from pytgi.server.completions import completions
from pytgi.server.context import ServerContext, get_context
from pytgi.server.errors import error_response
from pytgi.server.openai_protocol import ChatRequest, CompletionRequest
from pytgi.server.openai_routes import chat
from pytgi.server.protocol import CompatGenerateRequest
from pytgi.server.strict_json import StrictJSONRoute
from pytgi.server.tgi_routes import ERRORS, SSE_RESPONSE, compat_generate

router = APIRouter(route_class=StrictJSONRoute)

_KINDS: list[tuple[str, type[BaseModel]]] = [
    ("inputs", CompatGenerateRequest),
    ("messages", ChatRequest),
    ("prompt", CompletionRequest),
]


def parse_body(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` as `model`; a mismatch is the same 422 as a route's own body."""
    try:
        return model.model_validate(body)
    except PydanticValidationError as exc:
        raise RequestValidationError(exc.errors(include_input=False)) from None


@router.post(
    "/invocations",
    operation_id="sagemaker_compatibility",
    responses={**SSE_RESPONSE, **ERRORS},
)
async def post_invocations(
    request: Request, body: dict[str, Any] = Body(...), ctx: ServerContext = Depends(get_context)
):
    for key, model in _KINDS:
        if key in body:
            req = parse_body(model, body)
            if isinstance(req, CompatGenerateRequest):
                return await compat_generate(ctx, req, request)
            if isinstance(req, ChatRequest):
                return await chat(ctx, req, request)
            return await completions(ctx, req, request)
    message = "Failed to deserialize the JSON body: expected `inputs`, `messages` or `prompt`"
    return error_response(422, message, "validation")
