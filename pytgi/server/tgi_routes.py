"""TGI's native routes (TGI_COMPATIBILITY.md §3, §6, §7, §10): generate, streams, tokenize, info,
health.

Each handler parses its wire type, calls `Infer`, and formats the result; typed errors become TGI
error bodies (non-streaming) or one SSE error event on HTTP 200 (streaming, as TGI does).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from pytgi import metrics
from pytgi.errors import PytgiError
from pytgi.router.outputs import SimpleToken
from pytgi.router.params import GenerateParameters
from pytgi.server.context import ServerContext, get_context
from pytgi.server.disconnect import until_disconnected
from pytgi.server.errors import error_body, log_error
from pytgi.server.headers import generation_headers, stream_headers
from pytgi.server.health import Health
from pytgi.server.protocol import (
    CompatGenerateRequest,
    ErrorResponse,
    GenerateRequest,
    GenerateResponse,
    Info,
    StreamResponse,
)
from pytgi.server.responses import JSONBody
from pytgi.server.sse import EventStreamResponse, data_frame
from pytgi.server.strict_json import StrictJSONRoute

logger = logging.getLogger(__name__)

router = APIRouter(route_class=StrictJSONRoute)

ERRORS = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in [
        (422, "Input validation error"),
        (424, "Generation error"),
        (429, "Model is overloaded"),
        (500, "Incomplete generation"),
    ]
}
SSE_RESPONSE = {200: {"content": {"text/event-stream": {}}, "description": "Generated text"}}
_TEXT_PIPELINES = (None, "text-generation")


async def run_generate(
    ctx: ServerContext, inputs: str, params: GenerateParameters
) -> tuple[GenerateResponse, dict[str, str]]:
    """A non-streaming generation as TGI's `GenerateResponse`, with its `x-*` headers."""
    gen = await ctx.infer.generate(inputs, params)
    details = params.details or params.decoder_input_details
    body = GenerateResponse.from_generation(gen, details=details)
    headers = generation_headers(
        ctx.compute_type, inputs, gen.timings, gen.input_length, gen.generated_tokens
    )
    return body, headers


async def tgi_stream_frames(
    ctx: ServerContext, inputs: str, params: GenerateParameters
) -> AsyncIterator[str]:
    """`/generate_stream` events; an error becomes TGI's `{"error", "error_type"}` event."""
    stream = ctx.infer.generate_stream(inputs, params)
    try:
        async for event in stream:
            yield data_frame(StreamResponse.from_event(event, details=params.details))
    except PytgiError as exc:
        log_error("generate_stream", exc.status_code, exc.message, exc.error_type)
        yield data_frame(error_body(exc.message, exc.error_type))
    except Exception:
        logger.exception("generate_stream failed")
        yield data_frame(error_body("Internal server error", "internal"))
    finally:
        await stream.aclose()


def generate_stream_response(
    ctx: ServerContext, inputs: str, params: GenerateParameters
) -> EventStreamResponse:
    return EventStreamResponse(
        tgi_stream_frames(ctx, inputs, params),
        headers=stream_headers(ctx.compute_type, inputs),
        keep_alive_s=ctx.keep_alive_s,
    )


async def compat_generate(
    ctx: ServerContext, req: CompatGenerateRequest, request: Request
) -> Response:
    """`POST /`: a stream, or a one-element list, with TGI's `return_full_text` default."""
    params = req.generate_parameters()
    if params.return_full_text is None:
        full_text = ctx.model_info.get("model_pipeline_tag") in _TEXT_PIPELINES
        params = params.model_copy(update={"return_full_text": full_text})
    if req.stream:
        return generate_stream_response(ctx, req.inputs, params)
    work = run_generate(ctx, req.inputs, params)
    body, headers = await until_disconnected(request, work)
    return JSONBody([body], headers=headers)


@router.post(
    "/",
    operation_id="compat_generate",
    response_model=list[GenerateResponse],
    responses={**SSE_RESPONSE, **ERRORS},
)
async def post_root(
    req: CompatGenerateRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    return await compat_generate(ctx, req, request)


@router.post(
    "/generate", operation_id="generate", response_model=GenerateResponse, responses=ERRORS
)
async def post_generate(
    req: GenerateRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    work = run_generate(ctx, req.inputs, req.generate_parameters())
    body, headers = await until_disconnected(request, work)
    return JSONBody(body, headers=headers)


@router.post("/generate_stream", operation_id="generate_stream", responses=SSE_RESPONSE)
async def post_generate_stream(req: GenerateRequest, ctx: ServerContext = Depends(get_context)):
    return generate_stream_response(ctx, req.inputs, req.generate_parameters())


@router.post("/tokenize", operation_id="tokenize", response_model=list[SimpleToken])
async def post_tokenize(req: GenerateRequest, ctx: ServerContext = Depends(get_context)):
    spans = await ctx.infer.tokenize(req.inputs)
    return JSONBody(spans)


@router.get("/info", operation_id="get_model_info", response_model=Info)
async def get_info(ctx: ServerContext = Depends(get_context)):
    return JSONBody(ctx.info())


@router.get(
    "/health",
    operation_id="health",
    responses={200: {"description": "Everything is working fine"}, 503: {"model": ErrorResponse}},
)
async def get_health(ctx: ServerContext = Depends(get_context)):
    if ctx.health.status == Health.READY and ctx.engine.is_alive:
        return Response(status_code=200)
    message = "draining" if ctx.health.status == Health.DRAINING else "unhealthy"
    return JSONBody(error_body(message, "healthcheck"), status_code=503)


router.add_api_route("/", get_health, methods=["GET"], include_in_schema=False)
router.add_api_route("/ping", get_health, methods=["GET"], include_in_schema=False)


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus metrics"}},
)
async def get_metrics(ctx: ServerContext = Depends(get_context)):
    metrics.refresh(ctx.engine.stats(), ctx.cache_info.max_batch_total_tokens)
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
