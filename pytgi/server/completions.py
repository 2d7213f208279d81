"""OpenAI legacy completions: `POST /v1/completions` (TGI_COMPATIBILITY.md §9).

One request may carry up to `max_client_batch_size` prompts; they run concurrently. Non-streaming
choices are returned sorted by `index` (TGI: in completion order) with summed usage and `x-*`
headers. Streams interleave the prompts' token events; each prompt ends with a final event
carrying its usage, and the stream ends with `data: [DONE]`. Finish reasons use the chat mapping
(`eos_token` → "stop") in both modes (TGI's stream sends the raw `eos_token`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request

from pytgi import metrics
from pytgi.router.outputs import Generation, StreamEvent
from pytgi.router.params import GrammarParam
from pytgi.server.chat_format import finish_reason, usage
from pytgi.server.context import ServerContext, get_context
from pytgi.server.disconnect import until_disconnected
from pytgi.server.errors import error_response, openai_event_stream
from pytgi.server.headers import HeaderTotals, stream_headers
from pytgi.server.openai_protocol import CompletionRequest, response_format_param
from pytgi.server.responses import JSONBody
from pytgi.server.sse import EventStreamResponse, data_frame
from pytgi.server.streams import gather_or_cancel, merge_streams
from pytgi.server.strict_json import StrictJSONRoute
from pytgi.server.tgi_routes import ERRORS, SSE_RESPONSE

logger = logging.getLogger(__name__)

router = APIRouter(route_class=StrictJSONRoute)


def _reject(req: CompletionRequest, max_batch: int):
    """TGI's request-level checks, with its `error_type`s; None when the request is fine."""
    if req.suffix is not None:
        message = "Suffix is not supported and can be achieved by preprocessing the prompt."
        return error_response(422, message, "suffix not supported")
    prompts = req.prompts
    if not prompts:
        message = "Empty array detected. Do not use an empty array for the prompt."
        return error_response(422, message, "empty input")
    if len(prompts) > max_batch:
        message = f"Number of prompts exceeds the maximum allowed batch size of {max_batch}"
        return error_response(422, message, "batch size exceeded")
    return None


class CompletionBodies:
    """The `text_completion` objects of one request."""

    def __init__(self, ctx: ServerContext):
        self.created = int(time.time())
        self.model = ctx.model_id
        self.fingerprint = ctx.system_fingerprint

    def _head(self) -> dict[str, Any]:
        return {
            "object": "text_completion",
            "id": "",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    def final(self, choices: list[dict[str, Any]], totals: dict[str, int]) -> dict[str, Any]:
        return {**self._head(), "choices": choices, "usage": totals}

    def event(self, index: int, event: StreamEvent) -> dict[str, Any]:
        choice = {"index": index, "text": event.text_delta, "logprobs": None}
        if event.details is None:
            return {**self._head(), "choices": [{**choice, "finish_reason": ""}]}
        choice["finish_reason"] = finish_reason(event.details.finish_reason)
        d = event.details
        return self.final([choice], usage(d.input_length, d.generated_tokens))


def _choice(index: int, gen: Generation) -> dict[str, Any]:
    return {
        "index": index,
        "text": gen.generated_text,
        "logprobs": None,
        "finish_reason": finish_reason(gen.finish_reason),
    }


async def completions_json(
    ctx: ServerContext, req: CompletionRequest, grammar: GrammarParam | None
) -> JSONBody:
    params = req.generate_parameters(grammar, ctx.lora_adapters)
    prompts = req.prompts
    gens = await gather_or_cancel([ctx.infer.generate(p, params) for p in prompts])
    totals = HeaderTotals(compute_characters=sum(len(p) for p in prompts))
    for gen in gens:
        totals.add(
            gen.timings, prompt_tokens=gen.input_length, generated_tokens=gen.generated_tokens
        )
    body = CompletionBodies(ctx).final(
        [_choice(i, gen) for i, gen in enumerate(gens)],
        usage(totals.prompt_tokens, totals.generated_tokens),
    )
    return JSONBody(body, headers=totals.to_headers(ctx.compute_type))


def completion_frames(
    ctx: ServerContext, req: CompletionRequest, grammar: GrammarParam | None = None
) -> AsyncIterator[str]:
    return openai_event_stream(_event_frames(ctx, req, grammar), "completions")


async def _event_frames(
    ctx: ServerContext, req: CompletionRequest, grammar: GrammarParam | None
) -> AsyncIterator[str]:
    params = req.generate_parameters(grammar, ctx.lora_adapters)
    bodies = CompletionBodies(ctx)
    merged = merge_streams([ctx.infer.generate_stream(p, params) for p in req.prompts])
    try:
        async for index, event in merged:
            yield data_frame(bodies.event(index, event))
    finally:
        await merged.aclose()


async def completions(ctx: ServerContext, req: CompletionRequest, request: Request):
    metrics.tgi_request_count.inc()
    rejection = _reject(req, ctx.config.limits.max_client_batch_size)
    if rejection is not None:
        return rejection
    grammar = response_format_param(req.response_format)
    if not req.stream:
        return await until_disconnected(request, completions_json(ctx, req, grammar))
    characters = "".join(req.prompts)
    return EventStreamResponse(
        completion_frames(ctx, req, grammar),
        headers=stream_headers(ctx.compute_type, characters),
        keep_alive_s=ctx.keep_alive_s,
    )


@router.post("/v1/completions", operation_id="completions", responses={**SSE_RESPONSE, **ERRORS})
async def post_completions(
    req: CompletionRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    return await completions(ctx, req, request)
