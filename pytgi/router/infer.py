"""`Infer`: the request lifecycle above the engine (contract §3, §4.5, §7).

One `Infer` per server. Every TGI/OpenAI route is built from its methods: `generate` /
`generate_stream` (validation, concurrency permit, best_of, details, stop strings, detokenization),
`tokenize`, and `render_chat` + `parse_tool_call` for the chat routes. Errors are raised as
`pytgi.errors` types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from pytgi.config import CacheInfo, LimitsConfig
from pytgi.engine.client import EngineClient
from pytgi.router.outputs import ChatPrompt, Generation, StreamEvent, TokenSpan, ToolCall
from pytgi.router.params import GenerateParameters, GrammarParam
from pytgi.tokenizer.tokenizer import Tokenizer


class Infer:
    """Validates, admits and runs generations on an `EngineClient`.

    Concurrency: at most `limits.max_concurrent_requests` generations run at once; one more is
    refused at once with `OverloadedError` (never queued here — the engine queues). A `best_of=n`
    request takes n permits.
    """

    def __init__(
        self,
        engine: EngineClient,
        tokenizer: Tokenizer,
        limits: LimitsConfig,
        cache_info: CacheInfo,
        *,
        enable_prefill_logprobs: bool = False,
        disable_grammar_support: bool = False,
    ):
        raise NotImplementedError

    async def generate(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> Generation:
        """Run one (or `best_of`) generation to the end.

        Raises `ValidationError` (422), `OverloadedError` (429), `GenerationError` (424, "Request
        failed during generation: …") or `IncompleteGenerationError` (500).
        """
        raise NotImplementedError

    def generate_stream(
        self, inputs: str, params: GenerateParameters, *, add_special_tokens: bool = True
    ) -> AsyncIterator[StreamEvent]:
        """Stream token events; the last carries `generated_text` and `details`.

        Validation and overload errors are raised on the first `__anext__` (before any event), so
        the server can send them as an SSE error event. Closing the iterator early (client gone)
        aborts the request in the engine and releases the permit.
        """
        raise NotImplementedError

    async def tokenize(self, inputs: str, *, add_special_tokens: bool = True) -> list[TokenSpan]:
        """TGI `/tokenize`: ids with their text and byte offsets into `inputs` (no truncation)."""
        raise NotImplementedError

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        tool_prompt: str | None = None,
        response_format: GrammarParam | None = None,
    ) -> ChatPrompt:
        """Apply the chat template, with tool injection and the tool/response_format grammar (§8).

        Raises `TemplateError` / `ToolError`. Tokenize the returned text with
        `add_special_tokens=False`.
        """
        raise NotImplementedError

    def parse_tool_call(self, generated_text: str) -> ToolCall:
        """Parse `{"function": {"_name": ..., <args>}}` from a tool-mode generation (§8).

        Raises `ToolError("Tool error: Failed to parse generated text: …")`.
        """
        raise NotImplementedError
