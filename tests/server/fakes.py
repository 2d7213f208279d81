"""Test doubles for the server: a scripted `EngineClient` and a scripted router (`ScriptedInfer`).

`FakeEngine` is the engine the real `Infer` runs on in these tests: it emits the token ids of a
script text, one per step, honouring `max_new_tokens` and EOS, and records aborts. Swap it for
`InprocEngineClient` on a tiny model to run the same tests end to end.

`ScriptedInfer` replaces the router to test what only the server does (framing, error mapping,
tool-call streaming, disconnects) without depending on validation or detokenization.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from pytgi.config import CacheInfo
from pytgi.engine.client import EngineStats
from pytgi.errors import PytgiError, ToolError
from pytgi.messages.outputs import RequestOutput, SampledToken
from pytgi.messages.request import EngineRequest, FinishReason
from pytgi.router.outputs import (
    ChatPrompt,
    Generation,
    SimpleToken,
    StreamDetails,
    StreamEvent,
    Timings,
    Token,
    ToolCall,
)
from pytgi.router.params import GenerateParameters, GrammarParam

CACHE_INFO = CacheInfo(
    num_blocks=64,
    block_size=16,
    max_total_tokens=512,
    max_input_tokens=500,
    max_batch_total_tokens=1024,
    max_position_embeddings=512,
    dtype="float32",
    device="cpu",
)


class FakeEngine:
    """An `EngineClient` that streams a fixed list of token ids, `delay_s` apart."""

    def __init__(
        self, token_ids: Sequence[int], *, delay_s: float = 0.0, cache_info: CacheInfo = CACHE_INFO
    ):
        self.token_ids = list(token_ids)
        self.delay_s = delay_s
        self.cache_info = cache_info
        self.requests: list[EngineRequest] = []
        self.active: set[str] = set()
        self.aborted: set[str] = set()
        self.alive = True

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        self.requests.append(request)
        self.active.add(request.request_id)
        finished = False
        try:
            for i in range(request.stopping.max_new_tokens):
                await asyncio.sleep(self.delay_s)
                output = self._output(request, i)
                finished = output.finished
                yield output
                if finished:
                    return
        finally:
            self.active.discard(request.request_id)
            if not finished:
                self.aborted.add(request.request_id)

    def _output(self, request: EngineRequest, i: int) -> RequestOutput:
        token_id = self.token_ids[i % len(self.token_ids)]
        top_n = request.sampling.top_n_tokens
        top_ids = [token_id] + [(token_id + k) % 300 + 10 for k in range(1, top_n)]
        token = SampledToken(token_id, -0.5, top_ids[:top_n], [-0.5 - k for k in range(top_n)])
        reason = None
        if token_id in request.stopping.eos_token_ids:
            reason = FinishReason.EOS_TOKEN
        elif i + 1 == request.stopping.max_new_tokens:
            reason = FinishReason.LENGTH
        return RequestOutput(
            request.request_id,
            new_tokens=[token],
            finished=reason is not None,
            finish_reason=reason,
            num_prompt_tokens=len(request.prompt_ids),
        )

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self.active), num_kv_blocks=64, num_free_kv_blocks=60)

    @property
    def is_alive(self) -> bool:
        return self.alive

    async def shutdown(self) -> None:
        self.alive = False


class ScriptedInfer:
    """A router stand-in: every generation produces `words` (one token each)."""

    def __init__(self, words: Sequence[str] = (" Hello", " world", "!"), delay_s: float = 0.0):
        self.words = list(words)
        self.delay_s = delay_s
        self.error: PytgiError | None = None  # raised before the first token
        self.calls: list[tuple[str, GenerateParameters]] = []
        self.closed_streams = 0
        self.open_streams = 0

    def _words(self, params: GenerateParameters) -> list[str]:
        n = params.max_new_tokens or len(self.words)
        return (self.words * (n // len(self.words) + 1))[:n]

    async def generate(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> Generation:
        self.calls.append((inputs, params))
        if self.error is not None:
            raise self.error
        words = self._words(params)
        tokens = [Token(i, w, -0.25, False) for i, w in enumerate(words)]
        top = [[t, Token(99, " alt", -2.0, False)] for t in tokens] if params.top_n_tokens else []
        prefix = inputs if params.return_full_text else ""
        return Generation(
            generated_text=prefix + "".join(words),
            finish_reason=FinishReason.LENGTH,
            generated_tokens=len(tokens),
            seed=params.seed,
            prefill=[],
            tokens=tokens,
            top_tokens=top,
            input_length=len(inputs.split()),
            timings=Timings(0.001, 0.002, 0.03, 0.033),
        )

    async def generate_stream(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> AsyncIterator[StreamEvent]:
        self.calls.append((inputs, params))
        if self.error is not None:
            raise self.error
        self.open_streams += 1
        try:
            words = self._words(params)
            for i, word in enumerate(words, start=1):
                await asyncio.sleep(self.delay_s)
                yield self._event(i, word, words, inputs, params)
        finally:
            self.open_streams -= 1
            self.closed_streams += 1

    def _event(self, i, word, words, inputs, params) -> StreamEvent:
        token = Token(i, word, -0.25, False)
        if i < len(words):
            return StreamEvent(i, token, [], text_delta=word)
        details = StreamDetails(FinishReason.LENGTH, len(words), params.seed, len(inputs.split()))
        prefix = inputs if params.return_full_text else ""
        return StreamEvent(i, token, [], word, prefix + "".join(words), details)

    async def tokenize(self, inputs: str, *, add_special_tokens: bool = True) -> list[SimpleToken]:
        spans, start = [], 0
        for i, word in enumerate(inputs.split(" ")):
            spans.append(SimpleToken(i, word, start, start + len(word)))
            start += len(word) + 1
        return spans

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        tool_prompt: str | None = None,
        response_format: GrammarParam | None = None,
    ) -> ChatPrompt:
        text = "".join(f"<|{m['role']}|>{m.get('content', '')}\n" for m in messages)
        names = tuple(t["function"]["name"] for t in tools or ()) if tool_choice != "none" else ()
        return ChatPrompt(text + "<|assistant|>\n", response_format, names)

    def parse_tool_call(self, generated_text: str, prompt: ChatPrompt | None = None) -> ToolCall:
        try:
            function = dict(json.loads(generated_text)["function"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ToolError(f"Tool error: Failed to parse generated text: {exc}") from None
        return ToolCall(function.pop("_name"), function)
