"""What `Infer` returns: the result objects of TGI's responses (TGI_COMPATIBILITY.md §6, §7, §10).

`Token`, `PrefillToken`, `SimpleToken`, `BestOfSequence` and `StreamDetails` are the wire types
themselves (pydantic dataclasses, TGI's names and field order): the server's response models
(`server/protocol.py`) hold them and serialise them as they are. `finish_reason` is the engine's
`FinishReason` (a `str` enum whose values are TGI's wire strings: "length", "eos_token",
"stop_sequence"); the other results are plain dataclasses the server formats.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ConfigDict, Field, SkipValidation, model_serializer
from pydantic.dataclasses import dataclass as pydantic_dataclass

from pytgi.messages.request import FinishReason
from pytgi.router.params import GrammarParam

# a FinishReason (a `str` enum) kept as it is, a plain string in the OpenAPI document (as TGI
# declares it) and on the wire (its value)
WireFinishReason = Annotated[str, SkipValidation]


def _without_description(schema: dict[str, Any]) -> None:
    schema.pop("description", None)  # the docstrings are for readers of this code


# the wire types' OpenAPI schemas: TGI's names and fields, no docstrings
wire_dataclass = pydantic_dataclass(config=ConfigDict(json_schema_extra=_without_description))


@wire_dataclass
class Token:
    """A generated token (or a top-n alternative): text decoded with special tokens kept."""

    id: int
    text: str
    logprob: float | None
    special: bool


@wire_dataclass
class PrefillToken:
    """A prompt token; the first one has no prediction, so its logprob is None (TGI: null)."""

    id: int
    text: str
    logprob: float | None


@wire_dataclass
class SimpleToken:
    """A `/tokenize` entry: byte offsets into the UTF-8 `inputs`; `text` is that slice."""

    id: int
    text: str
    start: int
    stop: int


@dataclass
class Timings:
    """Seconds spent per phase, for TGI's `x-*-time` headers and the request histograms."""

    validation_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    total_s: float = 0.0

    def per_token_s(self, generated_tokens: int) -> float:
        return self.inference_s / generated_tokens if generated_tokens > 0 else 0.0


@wire_dataclass
class BestOfSequence:
    """A losing `best_of` candidate (TGI `details.best_of_sequences[]`); `top_tokens` is left off
    the wire when empty (TGI omits the key)."""

    generated_text: str
    finish_reason: WireFinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]] | None = None

    @model_serializer(mode="wrap")
    def _omit_empty_top_tokens(self, handler):
        data = handler(self)
        if not data.get("top_tokens"):
            data.pop("top_tokens", None)
        return data


@dataclass
class Generation:
    """The result of a non-streaming generation.

    `generated_text` is decoded with special tokens skipped, prefixed with the raw inputs when
    `return_full_text`. `seed` is set only when the request sampled. `prefill` is [] unless the
    server runs with `--enable-prefill-logprobs` and the request asked for `decoder_input_details`.
    `top_tokens` is [] unless `top_n_tokens` > 0. `best_of_sequences` is None unless `best_of` > 1.
    """

    generated_text: str
    finish_reason: FinishReason
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]]
    input_length: int
    timings: Timings
    best_of_sequences: list[BestOfSequence] | None = None


@wire_dataclass
class StreamDetails:
    """Carried by the last stream event (TGI `StreamDetails` + `input_length`); the timings stay
    off the wire (they become headers and metrics)."""

    finish_reason: WireFinishReason
    generated_tokens: int
    seed: int | None
    input_length: int
    timings: Timings = Field(default_factory=Timings, exclude=True)


@dataclass
class StreamEvent:
    """One token of a stream. `index` starts at 1.

    Only the last event has `generated_text` (full text, with the inputs when `return_full_text`)
    and `details`; the router always fills `details` there — the server drops it from the wire
    unless the request asked for `details` (chat and completions need `finish_reason` and the token
    counts anyway). `text_delta` is the detokenized text this token adds to `generated_text`
    (special tokens skipped; held back while it could be an incomplete UTF-8 char or the start of a
    stop sequence), which is what OpenAI-style deltas want; `token.text` is the raw single-token
    text TGI streams.
    """

    index: int
    token: Token
    top_tokens: list[Token]
    text_delta: str = ""
    generated_text: str | None = None
    details: StreamDetails | None = None


@dataclass
class ChatPrompt:
    """A rendered chat request, for `Infer.generate(text, params, add_special_tokens=False)`.

    Set `params.grammar = grammar`: the `response_format`, or in tool mode the tool grammar when
    the engine can enforce it (else None: the model is only asked, by the prompt, to emit the
    call). `tool_names` is non-empty in tool mode: parse the output with
    `Infer.parse_tool_call(text, prompt)`. `tool_mode` is "auto", "required" or "named".
    """

    text: str
    grammar: GrammarParam | None = None
    tool_names: tuple[str, ...] = ()
    tool_grammar: GrammarParam | None = None
    tool_mode: str | None = None

    @property
    def uses_tools(self) -> bool:
        return bool(self.tool_names)


@dataclass
class ToolCall:
    """A tool call parsed from generated text. `name == "no_tool"` means: answer without tools."""

    name: str
    arguments: dict[str, Any]
