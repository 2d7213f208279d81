"""OpenAI-compatible chat: `/v1/chat/completions`, `/chat_tokenize`, `/v1/models`
(TGI_COMPATIBILITY.md §8).

The chat template is rendered by the router (in a worker thread: templates come from model files
and must not stall the event loop). Template and tool errors answer HTTP 422 before any stream
starts; once streaming, errors are TGI's `{"error": {"message", "http_status_code"}}` event
followed by `data: [DONE]`. Tool mode is handled here: parse the call (non-streaming) or stream it
(`tool_stream`); a `no_tool` answer re-runs the request without tools, as TGI does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from pytgi import metrics
from pytgi.errors import TemplateError, ToolError, ValidationError
from pytgi.messages.request import FinishReason
from pytgi.router.outputs import ChatPrompt, Generation, StreamDetails
from pytgi.router.params import GrammarParam
from pytgi.router.tools import NO_TOOL, parse_tool_call
from pytgi.server.chat_format import ChatChunks, arguments_message, chat_completion, usage
from pytgi.server.context import ServerContext, get_context
from pytgi.server.disconnect import until_disconnected
from pytgi.server.errors import openai_event_stream
from pytgi.server.headers import generation_headers, stream_headers
from pytgi.server.openai_protocol import ChatRequest, response_format_param
from pytgi.server.protocol import ChatTokenizeResponse
from pytgi.server.responses import JSONBody
from pytgi.server.sse import EventStreamResponse, data_frame
from pytgi.server.strict_json import StrictJSONRoute
from pytgi.server.tgi_routes import ERRORS, SSE_RESPONSE
from pytgi.server.tool_stream import ToolCallStreamer, stream_tool_call_id

logger = logging.getLogger(__name__)

router = APIRouter(route_class=StrictJSONRoute)


def _grammar(req: ChatRequest) -> GrammarParam | None:
    return response_format_param(req.response_format)


async def render(ctx: ServerContext, req: ChatRequest) -> ChatPrompt:
    if not req.messages:
        raise ValidationError("Input validation error: `messages` cannot be empty")
    try:
        return await run_in_threadpool(
            ctx.infer.render_chat,
            req.message_dicts(),
            tools=req.tool_dicts(),
            tool_choice=req.tool_choice,
            tool_prompt=req.tool_prompt,
            response_format=_grammar(req),
        )
    except TemplateError:
        metrics.tgi_request_failure.labels(err="template").inc()
        raise


def _no_tool_request(req: ChatRequest) -> ChatRequest:
    return req.model_copy(update={"tools": None, "tool_choice": None})


def cut_off_tool_call(gen: Generation) -> dict[str, Any] | None:
    """A tool call that max_tokens cut off, as OpenAI answers it (finish_reason "length"): the
    name and the arguments written so far. TGI answers 422 "Failed to parse generated text";
    clients (LangChain's function-calling structured output) handle OpenAI's answer. None when
    the text is a whole call, the name is not written yet, or the generation did not stop on
    length."""
    if gen.finish_reason != FinishReason.LENGTH or _is_whole_call(gen.generated_text):
        return None
    streamer = ToolCallStreamer()
    pieces = streamer.feed(gen.generated_text)
    if streamer.name is None:  # a name cut off right after its closing quote is complete
        pieces = streamer.feed(",")
    if streamer.name is None or streamer.name == NO_TOOL:
        return None  # as TGI: 422, or (tool_choice auto) the answer without tools
    pieces += streamer.finish()
    return arguments_message(streamer.name, "".join(fragment for _, fragment in pieces))


def _is_whole_call(text: str) -> bool:
    try:
        parse_tool_call(text)
    except ToolError:
        return False
    return True


async def chat_json(ctx: ServerContext, req: ChatRequest, prompt: ChatPrompt) -> JSONBody:
    params = req.generate_parameters(prompt.grammar, ctx.lora_adapters)
    gen = await ctx.infer.generate(prompt.text, params, add_special_tokens=False)
    tool_call = None
    if prompt.uses_tools:
        message = cut_off_tool_call(gen)
        if message is not None:
            body = chat_completion(ctx, gen, tool_call=None, logprobs=req.logprobs, message=message)
            return _chat_body(ctx, prompt, gen, body)
        tool_call = ctx.infer.parse_tool_call(gen.generated_text, prompt)
        if tool_call.name == NO_TOOL:
            plain = _no_tool_request(req)
            prompt = await render(ctx, plain)
            gen = await _generate_plain(ctx, plain, prompt)
            tool_call = None
    body = chat_completion(ctx, gen, tool_call=tool_call, logprobs=req.logprobs)
    return _chat_body(ctx, prompt, gen, body)


def _chat_body(ctx: ServerContext, prompt: ChatPrompt, gen: Generation, body: dict) -> JSONBody:
    headers = generation_headers(
        ctx.compute_type, prompt.text, gen.timings, gen.input_length, gen.generated_tokens
    )
    return JSONBody(body, headers=headers)


async def _generate_plain(ctx: ServerContext, req: ChatRequest, prompt: ChatPrompt) -> Generation:
    metrics.tgi_request_count.inc()
    params = req.generate_parameters(prompt.grammar, ctx.lora_adapters)
    return await ctx.infer.generate(prompt.text, params, add_special_tokens=False)


async def _content_frames(
    ctx: ServerContext, req: ChatRequest, prompt: ChatPrompt, chunks: ChatChunks
) -> AsyncIterator[str]:
    params = req.generate_parameters(prompt.grammar, ctx.lora_adapters)
    stream = ctx.infer.generate_stream(prompt.text, params, add_special_tokens=False)
    final: StreamDetails | None = None
    try:
        async for event in stream:
            yield data_frame(chunks.content(event, logprobs=req.logprobs))
            final = event.details or final
    finally:
        await stream.aclose()
    if req.include_usage and final is not None:
        yield data_frame(chunks.usage(usage(final.input_length, final.generated_tokens)))


async def _tool_frames(
    ctx: ServerContext, req: ChatRequest, prompt: ChatPrompt, chunks: ChatChunks
) -> AsyncIterator[str]:
    """Stream the call's arguments as they come; if the text never takes TGI's streamable form
    (grammar not enforced), parse it whole at the end as the router does."""
    params = req.generate_parameters(prompt.grammar, ctx.lora_adapters)
    stream = ctx.infer.generate_stream(prompt.text, params, add_special_tokens=False)
    streamer = ToolCallStreamer()
    call_id = stream_tool_call_id(req.message_dicts())
    text, details = "", None
    try:
        async for event in stream:
            text += event.text_delta
            details = event.details or details
            pieces = streamer.feed(event.text_delta)
            if streamer.name == NO_TOOL:
                break
            for name, fragment in pieces:
                yield data_frame(chunks.tool_call(call_id, name, fragment))
    finally:
        await stream.aclose()
    name = streamer.name
    if name is None:
        call = ctx.infer.parse_tool_call(text, prompt)
        name = call.name
        if name != NO_TOOL:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            yield data_frame(chunks.tool_call(call_id, name, arguments))
    if name == NO_TOOL:
        async for frame in _rerun_without_tools(ctx, req, chunks):
            yield frame
        return
    fragment = "".join(f for _, f in streamer.finish())
    reason = details.finish_reason if details is not None else None
    yield data_frame(chunks.tool_call(call_id, None, fragment, finish=reason))
    if req.include_usage and details is not None:
        yield data_frame(chunks.usage(usage(details.input_length, details.generated_tokens)))


async def _rerun_without_tools(
    ctx: ServerContext, req: ChatRequest, chunks: ChatChunks
) -> AsyncIterator[str]:
    metrics.tgi_request_count.inc()
    plain = _no_tool_request(req)
    async for frame in _content_frames(ctx, plain, await render(ctx, plain), chunks):
        yield frame


def chat_frames(ctx: ServerContext, req: ChatRequest, prompt: ChatPrompt) -> AsyncIterator[str]:
    frames = _tool_frames if prompt.uses_tools else _content_frames
    return openai_event_stream(frames(ctx, req, prompt, ChatChunks(ctx)), "chat")


async def chat(ctx: ServerContext, req: ChatRequest, request: Request):
    metrics.tgi_request_count.inc()
    prompt = await render(ctx, req)
    if not req.stream:
        return await until_disconnected(request, chat_json(ctx, req, prompt))
    return EventStreamResponse(
        chat_frames(ctx, req, prompt),
        headers=stream_headers(ctx.compute_type, prompt.text),
        keep_alive_s=ctx.keep_alive_s,
    )


@router.post(
    "/v1/chat/completions",
    operation_id="chat_completions",
    responses={**SSE_RESPONSE, **ERRORS},
)
async def post_chat_completions(
    req: ChatRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    return await chat(ctx, req, request)


@router.post(
    "/chat_tokenize", operation_id="get_chat_tokenize", response_model=ChatTokenizeResponse
)
async def post_chat_tokenize(req: ChatRequest, ctx: ServerContext = Depends(get_context)):
    metrics.tgi_request_count.inc()
    prompt = await render(ctx, req)
    spans = await ctx.infer.tokenize(prompt.text, add_special_tokens=False)
    return JSONBody(ChatTokenizeResponse(tokenize_response=spans, templated_text=prompt.text))


@router.get("/v1/models", operation_id="openai_get_model_info")
async def get_models(ctx: ServerContext = Depends(get_context)) -> dict[str, Any]:
    ids = [ctx.model_id, *ctx.lora_adapters]  # a LoRA adapter is picked by `model`
    models = [{"id": i, "object": "model", "created": 0, "owned_by": ctx.model_id} for i in ids]
    return {"object": "list", "data": models}
