"""`Infer`: the request lifecycle above the engine (TGI_COMPATIBILITY.md §11, §13).

One `Infer` per server. Every TGI/OpenAI route is built from its methods: `generate` /
`generate_stream` (validation, concurrency permit, best_of, details, stop strings,
detokenization), `tokenize`, and `render_chat` + `parse_tool_call` for the chat routes. Errors are
raised as `pytgi.errors` types whose messages already carry TGI's prefixes.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager
from typing import Any

from pytgi.config import CacheInfo, LimitsConfig
from pytgi.engine.client import EngineClient
from pytgi.errors import IncompleteGenerationError, OverloadedError
from pytgi.messages.outputs import ErrorKind, RequestOutput
from pytgi.messages.request import FinishReason
from pytgi.router import request_metrics
from pytgi.router.chat import ChatRenderer
from pytgi.router.errors import IncompleteStreamError, generation_error
from pytgi.router.grammar import grammar_error
from pytgi.router.outputs import (
    ChatPrompt,
    Generation,
    SimpleToken,
    StreamDetails,
    StreamEvent,
    Timings,
    ToolCall,
)
from pytgi.router.params import GenerateParameters
from pytgi.router.sequence import SequenceBuilder, TokenStep
from pytgi.router.tools import parse_tool_call
from pytgi.router.validation import Validator, ValidRequest
from pytgi.tokenizer.tokenizer import Tokenizer


class Infer:
    """Validates, admits and runs generations on an `EngineClient`.

    Concurrency: at most `limits.max_concurrent_requests` generations run at once; one more is
    refused at once with `OverloadedError` (never queued here: the engine queues). A `best_of=n`
    request takes n permits.

    `engine_supports_grammar`: the engine applies grammars (`SamplingParams.grammar`). While it is
    False every grammar and `response_format` is refused and tool calls are only prompted for.
    """

    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Tokenizer,
        limits: LimitsConfig,
        cache_info: CacheInfo,
        **validator_options,
    ):
        """`validator_options`: `Validator`'s keyword options (enable_prefill_logprobs,
        disable_grammar_support, engine_supports_grammar, grammar_config, images)."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.limits = limits
        self.cache_info = cache_info
        self.validator = Validator(tokenizer, limits, cache_info, **validator_options)
        self.chat = ChatRenderer(tokenizer, grammar_enforced=self.validator.engine_supports_grammar)
        self._max_in_flight = limits.max_concurrent_requests
        self.num_in_flight = 0

    async def generate(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> Generation:
        """Run one (or `best_of`) generation to the end.

        Raises `ValidationError` (422), `OverloadedError` (429), `GenerationError` (424, "Request
        failed during generation: …") or `IncompleteGenerationError` (500).
        """
        start = time.monotonic()
        with request_metrics.observe():
            best_of = self.validator.check_best_of(params)
            with self._permits(best_of):
                req = await self.validator.validate(
                    inputs, params, add_special_tokens=add_special_tokens
                )
                validated = time.monotonic()
                request_metrics.record_validated(req.input_length, req.stopping.max_new_tokens)
                builders = await self._run_candidates(req, _candidate_seeds(req))
        best = max(range(len(builders)), key=lambda i: builders[i].mean_logprob())
        prefix = inputs if req.return_full_text else ""
        chosen = builders[best]
        timings = _timings(start, validated, chosen.queue_s)
        request_metrics.record_success(timings, len(chosen.tokens), prompt_tokens=req.input_length)
        others = None
        if best_of > 1:
            others = [
                b.best_of_sequence(prefix + b.generated_text())
                for i, b in enumerate(builders)
                if i != best
            ]
        return Generation(
            generated_text=prefix + chosen.generated_text(),
            finish_reason=chosen.finish_reason,
            generated_tokens=len(chosen.tokens),
            seed=chosen.seed,
            prefill=chosen.prefill,
            tokens=chosen.tokens,
            top_tokens=chosen.top_tokens,
            input_length=req.input_length,
            timings=timings,
            best_of_sequences=others,
        )

    async def generate_stream(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> AsyncIterator[StreamEvent]:
        """Stream token events; the last carries `generated_text` and `details`.

        Validation and overload errors are raised on the first `__anext__` (before any event),
        so the server can send them as an SSE error event. Closing the iterator early (client
        gone) aborts the request in the engine and releases the permit.
        """
        start = time.monotonic()
        with request_metrics.observe():
            self.validator.check_best_of(params, stream=True)
            with self._permits(1):
                req = await self.validator.validate(
                    inputs, params, add_special_tokens=add_special_tokens
                )
                validated = time.monotonic()
                request_metrics.record_validated(req.input_length, req.stopping.max_new_tokens)
                builder = SequenceBuilder(self.tokenizer, req, req.sampling.seed)
                steps = self._token_steps(req, builder, stream_events=True)
                index = 0
                async with aclosing(steps) as deltas:
                    async for step_list in deltas:
                        for i, step in enumerate(step_list):
                            index += 1
                            if builder.finished and i == len(step_list) - 1:
                                timings = _timings(start, validated, builder.queue_s)
                                request_metrics.record_success(
                                    timings, len(builder.tokens), prompt_tokens=req.input_length
                                )
                                yield _final_event(index, step, builder, inputs, timings)
                                return
                            token_event = (step.token, step.top_tokens, step.text_delta)
                            yield StreamEvent(index, *token_event)
                # the engine finished without a token to carry the final event
                raise IncompleteStreamError()

    async def tokenize(self, inputs: str, *, add_special_tokens: bool = True) -> list[SimpleToken]:
        """TGI `/tokenize`: ids with their text and byte offsets into `inputs` (no truncation)."""
        encoded = await self.validator.encode(inputs, add_special_tokens=add_special_tokens)
        raw = inputs.encode("utf-8")
        return [
            SimpleToken(i, raw[s:e].decode("utf-8", "replace"), s, e)
            for i, (s, e) in zip(encoded.ids, encoded.offsets, strict=True)
        ]

    def render_chat(self, messages: Sequence[Mapping[str, Any]], **options) -> ChatPrompt:
        """Apply the chat template, with tool injection and the tool/response_format grammar
        (TGI_COMPATIBILITY.md §14); `options` are `ChatRenderer.render`'s (tools, tool_choice,
        tool_prompt, response_format).

        Raises `TemplateError` / `ToolError`. Tokenize the returned text with
        `add_special_tokens=False`. Rendering is CPU work: call it through a thread if the
        template is heavy.
        """
        return self.chat.render(messages, **options)

    def parse_tool_call(self, generated_text: str, prompt: ChatPrompt | None = None) -> ToolCall:
        """The tool call in a tool-mode generation (TGI_COMPATIBILITY.md §14).

        `name == "no_tool"` means the model answered without a tool: TGI then re-runs the request
        without tools and returns plain content. With an "auto" `prompt`, text that is no tool
        call counts as `no_tool` (`arguments["content"]` = the text). Raises `ToolError("Tool
        error: Failed to parse generated text: …")` or "Tool error: Tool with name X not found".
        """
        if prompt is None:
            return parse_tool_call(generated_text)
        auto = prompt.tool_mode == "auto"
        return parse_tool_call(generated_text, prompt.tool_names, auto=auto)

    @contextmanager
    def _permits(self, n: int) -> Iterator[None]:
        if self.num_in_flight + n > self._max_in_flight:
            raise OverloadedError()
        self.num_in_flight += n
        try:
            yield
        finally:
            self.num_in_flight -= n

    async def _run_candidates(
        self, req: ValidRequest, seeds: list[int | None]
    ) -> list[SequenceBuilder]:
        """Run the best_of candidates concurrently; the first failure cancels the others."""
        if len(seeds) == 1:
            return [await self._run_one(req, seeds[0])]
        tasks = [asyncio.ensure_future(self._run_one(req, seed)) for seed in seeds]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _run_one(self, req: ValidRequest, seed: int | None) -> SequenceBuilder:
        builder = SequenceBuilder(self.tokenizer, req, seed)
        async with aclosing(self._token_steps(req, builder)) as steps:
            async for _ in steps:
                pass
        return builder

    async def _token_steps(
        self, req: ValidRequest, builder: SequenceBuilder, *, stream_events: bool = False
    ) -> AsyncIterator[list[TokenStep]]:
        """Drive one engine request; closing this iterator (or a stop string) aborts it."""
        stream = self.engine.generate(req.engine_request(uuid.uuid4().hex, builder.seed))
        try:
            async for delta in stream:
                _check_delta(delta, req)
                steps = builder.add(delta)
                if builder.finished and not steps:
                    break
                yield steps
                if builder.finished:
                    break
        finally:
            await stream.aclose()
        if builder.finish_reason in (None, FinishReason.ABORTED):
            raise IncompleteStreamError() if stream_events else _incomplete()


def _incomplete() -> IncompleteGenerationError:
    return IncompleteGenerationError("Incomplete generation")


def _check_delta(delta: RequestOutput, req: ValidRequest) -> None:
    if delta.error is None:
        return
    if delta.error_kind == ErrorKind.GRAMMAR and req.grammar is not None:
        raise grammar_error(req.grammar, delta.error)  # 422, before any token
    raise generation_error(delta.error)


def _candidate_seeds(req: ValidRequest) -> list[int | None]:
    if req.best_of == 1:
        return [req.sampling.seed]
    return [random.getrandbits(64) for _ in range(req.best_of)]


def _timings(start: float, validated: float, queue_s: float) -> Timings:
    end = time.monotonic()
    return Timings(
        validation_s=validated - start,
        queue_s=queue_s,
        inference_s=max(end - validated - queue_s, 0.0),
        total_s=end - start,
    )


def _final_event(
    index: int, step: TokenStep, builder: SequenceBuilder, inputs: str, timings: Timings
) -> StreamEvent:
    prefix = inputs if builder.request.return_full_text else ""
    details = StreamDetails(
        finish_reason=builder.finish_reason,
        generated_tokens=len(builder.tokens),
        seed=builder.seed,
        input_length=builder.request.input_length,
        timings=timings,
    )
    return StreamEvent(
        index=index,
        token=step.token,
        top_tokens=step.top_tokens,
        text_delta=step.text_delta + builder.tail_text(),
        generated_text=prefix + builder.generated_text(),
        details=details,
    )
