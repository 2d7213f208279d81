"""OpenAI-compatible wire types of `/v1/chat/completions` and `/v1/completions`
(TGI_COMPATIBILITY.md §8, §9).

Requests are lenient (client compatibility, TGI_COMPATIBILITY.md §16): unknown keys and `null`s are
accepted, `max_completion_tokens` is an alias of `max_tokens`, `stop` may be a string, and
`response_format`
may use TGI's `{"type", "value"}` shape or OpenAI's (`json_schema` wrapper, bare `json_object`,
`text`). Responses are plain dicts in TGI's field order, built by the route modules.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

from pytgi.errors import ValidationError
from pytgi.router.params import GenerateParameters, GrammarParam
from pytgi.server.protocol import WireRequest


class Url(BaseModel):
    url: str


class MessageChunk(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: Url | None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    arguments: Any = None
    parameters: Any = None


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = ""
    type: str = "function"
    function: FunctionDefinition


class Message(WireRequest):
    """A chat message: `content` (string or parts) or `tool_calls`; other keys are kept."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[MessageChunk] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = "function"
    function: FunctionDefinition


class StreamOptions(WireRequest):
    include_usage: bool = False


def _stop_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _nucleus(top_p: float | None) -> float | None:
    """OpenAI's `top_p: 1` (the openai/LangChain default) means no nucleus filtering, as in OpenAI
    and vLLM; TGI refuses 1.0 (its own routes still do). Other values go to validation as is."""
    return None if top_p == 1 else top_p


def _temperature_params(temperature: float | None) -> dict[str, Any]:
    """TGI's OpenAI routes: `temperature: 0` is greedy; absent or anything else samples."""
    if temperature == 0:
        return {"do_sample": False, "temperature": None}
    return {"do_sample": True, "temperature": temperature}


class ChatRequest(WireRequest):
    messages: list[Message]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: Any = None  # accepted, unused (TGI)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    n: int | None = None  # accepted, unused (TGI): one choice is returned
    presence_penalty: float | None = None
    stop: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Tool] | None = None
    tool_prompt: str | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return _stop_list(value)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def generate_parameters(
        self, grammar: GrammarParam | None, adapters: tuple[str, ...] = ()
    ) -> GenerateParameters:
        """TGI's chat → generate mapping (TGI_COMPATIBILITY.md §8), including
        `presence_penalty + 2.0`; `model` picks a LoRA adapter among `adapters` (any other name:
        the base model)."""
        repetition = None if self.presence_penalty is None else self.presence_penalty + 2.0
        max_tokens = self.max_tokens if self.max_tokens is not None else self.max_completion_tokens
        return GenerateParameters(
            **_temperature_params(self.temperature),
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=repetition,
            top_p=_nucleus(self.top_p),
            max_new_tokens=max_tokens,
            stop=self.stop or [],
            seed=self.seed,
            top_n_tokens=self.top_logprobs,
            details=True,
            grammar=grammar,
            adapter_id=self.model if self.model in adapters else None,
        )

    def message_dicts(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        if self.tools is None:
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


class CompletionRequest(WireRequest):
    prompt: str | list[str]
    model: str | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    response_format: dict[str, Any] | None = None  # as on chat (vLLM has it here too)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        return _stop_list(value)

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def generate_parameters(
        self, grammar: GrammarParam | None = None, adapters: tuple[str, ...] = ()
    ) -> GenerateParameters:
        return GenerateParameters(
            **_temperature_params(self.temperature),
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            top_p=_nucleus(self.top_p),
            max_new_tokens=self.max_tokens,
            stop=self.stop or [],
            seed=self.seed,
            details=True,
            grammar=grammar,
            adapter_id=self.model if self.model in adapters else None,
        )


def response_format_grammar(response_format: dict[str, Any] | None) -> GrammarParam | None:
    """Normalise TGI's and OpenAI's `response_format` shapes to TGI's grammar (ecosystem C4).

    `{"type": "text"}` → no grammar; OpenAI `{"type": "json_schema", "json_schema": {...}}` →
    TGI `json_schema`; a bare `{"type": "json_object"}` keeps `value=None` (any JSON object).
    """
    if response_format is None or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_schema" and "value" not in response_format:
        return GrammarParam(type="json_schema", value=response_format.get("json_schema"))
    return GrammarParam.model_validate(response_format)


def response_format_param(response_format: dict[str, Any] | None) -> GrammarParam | None:
    """`response_format_grammar`, a malformed value answered as TGI's 422 validation error."""
    try:
        return response_format_grammar(response_format)
    except PydanticValidationError as exc:
        detail = "; ".join(str(e.get("msg")) for e in exc.errors())
        raise ValidationError(
            f"Input validation error: invalid `response_format`: {detail}"
        ) from None
