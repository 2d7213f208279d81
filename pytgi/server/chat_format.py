"""Chat response bodies: `chat.completion` objects and `chat.completion.chunk` events
(TGI_COMPATIBILITY.md §8).

Field order and values follow TGI: `id` is "", `system_fingerprint` is `<version>-<label>`, the
finish reason maps only `eos_token` to `"stop"`, every delta carries `role` and a string
`content` (never null: some clients cannot parse a null delta) and, unlike TGI, `"tool_calls":
null` in text deltas (the `text_generation` client's model requires that key), non-streaming
tool calls use id "0" and JSON-string `arguments`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pytgi.messages.request import FinishReason
from pytgi.router.outputs import Generation, StreamEvent, Token, ToolCall
from pytgi.server.context import ServerContext


def finish_reason(reason: FinishReason | None) -> str | None:
    if reason is None:
        return None
    return "stop" if reason == FinishReason.EOS_TOKEN else reason.value


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _logprob_entry(token: Token, top: list[Token]) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": token.logprob,
        "top_logprobs": [{"token": t.text, "logprob": t.logprob} for t in top],
    }


def generation_logprobs(gen: Generation) -> dict[str, Any]:
    tops = gen.top_tokens or [[] for _ in gen.tokens]
    return {"content": [_logprob_entry(t, top) for t, top in zip(gen.tokens, tops, strict=False)]}


def tool_call_message(call: ToolCall) -> dict[str, Any]:
    return arguments_message(call.name, json.dumps(call.arguments, ensure_ascii=False))


def arguments_message(name: str, arguments: str) -> dict[str, Any]:
    """A tool call whose `arguments` is JSON text (a call cut off by max_tokens: its prefix)."""
    function = {"description": None, "name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "tool_calls": [{"id": "0", "type": "function", "function": function}],
    }


def chat_completion(
    ctx: ServerContext,
    gen: Generation,
    *,
    tool_call: ToolCall | None,
    logprobs: bool,
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if message is None and tool_call is not None:
        message = tool_call_message(tool_call)
    elif message is None:
        message = {"role": "assistant", "content": gen.generated_text}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": generation_logprobs(gen) if logprobs else None,
        "finish_reason": finish_reason(gen.finish_reason),
    }
    return {
        "object": "chat.completion",
        "id": "",
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": ctx.system_fingerprint,
        "choices": [choice],
        "usage": usage(gen.input_length, gen.generated_tokens),
    }


class ChatChunks:
    """Builds the `chat.completion.chunk` events of one stream (shared `created`, model, id)."""

    def __init__(self, ctx: ServerContext):
        self.created = int(time.time())
        self.model = ctx.model_id
        self.fingerprint = ctx.system_fingerprint

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None) -> dict:
        return {
            "object": "chat.completion.chunk",
            "id": "",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": usage,
        }

    def content(self, event: StreamEvent, *, logprobs: bool) -> dict[str, Any]:
        reason = event.details.finish_reason if event.details is not None else None
        choice = {
            "index": 0,
            # `tool_calls: null`: text_generation's client requires the key in every delta
            "delta": {"role": "assistant", "content": event.text_delta, "tool_calls": None},
            "logprobs": {"content": [_logprob_entry(event.token, event.top_tokens)]}
            if logprobs
            else None,
            "finish_reason": finish_reason(reason),
        }
        return self._chunk([choice], None)

    def tool_call(
        self, call_id: str, name: str | None, arguments: str, finish: FinishReason | None = None
    ) -> dict[str, Any]:
        call = {
            "index": 0,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "tool_calls": [call]},
            "logprobs": None,
            "finish_reason": finish_reason(finish),
        }
        return self._chunk([choice], None)

    def usage(self, totals: dict[str, int]) -> dict[str, Any]:
        return self._chunk([], totals)
