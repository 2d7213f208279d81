"""Vertex AI's `POST /vertex` (TGI_COMPATIBILITY.md §3, §10): `{"instances": [...]}` →
`{"predictions": [...]}`.

TGI always registers it. Each instance is a generate request (`{inputs, parameters?}`, of whose
parameters only `max_new_tokens` and `seed` are honoured; it samples) or a chat request
(`messages`); the instances run concurrently and `predictions` holds their generated texts in
order. Not in the OpenAPI document, as in TGI's default build.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ConfigDict

from pytgi import metrics
from pytgi.router.params import GenerateParameters
from pytgi.server.context import ServerContext, get_context
from pytgi.server.disconnect import until_disconnected
from pytgi.server.errors import error_response
from pytgi.server.openai_protocol import ChatRequest
from pytgi.server.openai_routes import render
from pytgi.server.protocol import WireRequest
from pytgi.server.responses import JSONBody
from pytgi.server.sagemaker import parse_body
from pytgi.server.streams import gather_or_cancel
from pytgi.server.strict_json import StrictJSONRoute

router = APIRouter(route_class=StrictJSONRoute)


class VertexParameters(WireRequest):
    model_config = ConfigDict(extra="ignore", strict=True)

    max_new_tokens: int | None = None
    seed: int | None = None


class VertexGenerateInstance(WireRequest):
    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: str
    parameters: VertexParameters | None = None


class VertexRequest(WireRequest):
    instances: list[dict[str, Any]]


async def _predict(ctx: ServerContext, instance: dict[str, Any]) -> str:
    if "messages" in instance:
        chat = parse_body(ChatRequest, instance)
        prompt = await render(ctx, chat)
        params = chat.generate_parameters(prompt.grammar, ctx.lora_adapters)
        gen = await ctx.infer.generate(prompt.text, params, add_special_tokens=False)
        return gen.generated_text
    req = parse_body(VertexGenerateInstance, instance)
    given = req.parameters or VertexParameters()
    params = GenerateParameters(
        do_sample=True, max_new_tokens=given.max_new_tokens, seed=given.seed
    )
    return (await ctx.infer.generate(req.inputs, params)).generated_text


@router.post("/vertex", include_in_schema=False)
async def post_vertex(
    req: VertexRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    metrics.tgi_request_count.inc()
    if not req.instances:
        return error_response(422, "Input validation error", "Input validation error")
    work = gather_or_cancel([_predict(ctx, instance) for instance in req.instances])
    predictions = await until_disconnected(request, work)
    return JSONBody({"predictions": predictions})
