"""The three streaming APIs the benchmark speaks: request bodies and how to read their events.

- `tgi`: `POST /generate_stream`; one event per token; the last one carries `generated_text` and
  (with `details: true`) `details.generated_tokens`; errors are `{"error", "error_type"}` events.
- `chat`: `POST /v1/chat/completions`; `delta.content` chunks; `stream_options.include_usage`
  asks for a final chunk with `usage`; the stream ends with `[DONE]`.
- `completions`: `POST /v1/completions`; `text` chunks, otherwise like `chat`.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pytgi.benchmark.http.records import RequestSpec

API_NAMES = ("tgi", "chat", "completions")


@dataclass(frozen=True)
class ApiOptions:
    model: str = "tgi"  # OpenAI `model` field
    temperature: float | None = None  # None = greedy
    ignore_eos: bool = False  # vLLM / llama.cpp extension, OpenAI routes only


@dataclass
class StreamState:
    """What the events of one request said so far."""

    server_output_tokens: int | None = None
    server_prompt_tokens: int | None = None
    finished: bool = False  # the server said the generation is complete
    ended: bool = False  # no more events will come (TGI's final event, OpenAI's `[DONE]`)
    num_chunks: int = 0  # OpenAI chunks with a choice
    maybe_preamble: bool = False  # the first chunk was role-only with `content: ""`
    retract_first_token: bool = False  # ... and it turned out to carry no token
    error: str | None = None


class StreamProtocolError(ValueError):
    """An event that is not what the API promises (not JSON, not an object)."""


def parse_json_event(data: str) -> dict[str, Any]:
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        raise StreamProtocolError(f"malformed event: {data[:120]!r}") from None
    if not isinstance(event, dict):
        raise StreamProtocolError(f"event is not a JSON object: {data[:120]!r}")
    return event


class TgiApi:
    name = "tgi"
    path = "/generate_stream"
    end_marker = "generated_text (final event)"

    def __init__(self, options: ApiOptions):
        self.options = options

    def build_payload(self, spec: RequestSpec) -> dict[str, Any]:
        params: dict[str, Any] = {"max_new_tokens": spec.max_new_tokens, "details": True}
        if self.options.temperature is None:
            params["do_sample"] = False
        else:
            params.update(do_sample=True, temperature=self.options.temperature)
        return {"inputs": spec.prompt, "parameters": params}

    def read_event(self, data: str, state: StreamState) -> bool:
        """Updates `state`; returns whether the event carried a token."""
        event = parse_json_event(data)
        if event.get("error") is not None:
            state.error = f"{event.get('error_type') or 'error'}: {event['error']}"
            return False
        details = event.get("details") or {}
        state.server_output_tokens = details.get("generated_tokens", state.server_output_tokens)
        state.server_prompt_tokens = details.get("input_length", state.server_prompt_tokens)
        if event.get("generated_text") is not None or details:
            state.finished = state.ended = True
        return event.get("token") is not None


class OpenAIApi(ABC):
    """Shared reading of OpenAI chat and completions streams."""

    name = ""
    path = ""
    end_marker = "finish_reason or [DONE]"

    def __init__(self, options: ApiOptions):
        self.options = options

    def build_payload(self, spec: RequestSpec) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.options.model,
            "max_tokens": spec.max_new_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0 if self.options.temperature is None else self.options.temperature,
            **self.prompt_fields(spec.prompt),
        }
        if self.options.ignore_eos:
            payload["ignore_eos"] = True
        return payload

    def read_event(self, data: str, state: StreamState) -> bool:
        if data.strip() == "[DONE]":
            state.finished = state.ended = True
            return False
        event = parse_json_event(data)
        if event.get("error") is not None:
            state.error = _openai_error(event["error"])
            return False
        usage = event.get("usage") or {}
        state.server_output_tokens = usage.get("completion_tokens", state.server_output_tokens)
        state.server_prompt_tokens = usage.get("prompt_tokens", state.server_prompt_tokens)
        choices = event.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return False
        state.num_chunks += 1
        if choices[0].get("finish_reason"):
            state.finished = True
        return self.is_token(choices[0], state)

    @abstractmethod
    def prompt_fields(self, prompt: str) -> dict[str, Any]:
        """The request fields that carry the prompt."""

    @abstractmethod
    def is_token(self, choice: dict[str, Any], state: StreamState) -> bool:
        """Whether this chunk's first choice carries a generated token."""


class ChatApi(OpenAIApi):
    name = "chat"
    path = "/v1/chat/completions"

    def prompt_fields(self, prompt: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": prompt}]}

    def is_token(self, choice: dict[str, Any], state: StreamState) -> bool:
        """Every chunk with string content is a token (TGI sends `""` for a held-back partial
        character), except vLLM's opening chunk: role only, `content: ""`. It cannot be told
        apart from a TGI token that decoded to `""` until the next chunk: TGI names the role in
        every chunk, vLLM only in the first, so the first is retracted then.
        """
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if state.maybe_preamble and "role" not in delta:
            state.retract_first_token = True
        state.maybe_preamble = (
            state.num_chunks == 1
            and content == ""
            and "role" in delta
            and not choice.get("finish_reason")
        )
        return isinstance(content, str)


class CompletionsApi(OpenAIApi):
    name = "completions"
    path = "/v1/completions"

    def prompt_fields(self, prompt: str) -> dict[str, Any]:
        return {"prompt": prompt}

    def is_token(self, choice: dict[str, Any], state: StreamState) -> bool:
        return isinstance(choice.get("text"), str)


def _openai_error(error: Any) -> str:
    if isinstance(error, dict):
        status = error.get("http_status_code") or error.get("code")
        message = error.get("message") or json.dumps(error)
        return f"{status}: {message}" if status else str(message)
    return str(error)


def make_api(name: str, options: ApiOptions) -> TgiApi | OpenAIApi:
    apis: dict[str, type[TgiApi] | type[OpenAIApi]] = {
        "tgi": TgiApi,
        "chat": ChatApi,
        "completions": CompletionsApi,
    }
    return apis[name](options)
