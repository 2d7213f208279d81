"""TGI's wire types (TGI_COMPATIBILITY.md §6, §7, §10), named as in TGI's OpenAPI document.

Requests accept unknown keys and explicit `null` for every optional field (null = default).
Responses serialise in TGI's field order; keys TGI omits when empty are listed in `_omit_if_none`.
The token-level types (`Token`, `PrefillToken`, `SimpleToken`, `BestOfSequence`, `StreamDetails`)
are the router's own result types (`pytgi.router.outputs`), defined once there and serialised as
they are; the responses around them are built by the `from_*` constructors.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from pytgi.router import outputs as ro
from pytgi.router.outputs import BestOfSequence, PrefillToken, SimpleToken, StreamDetails, Token
from pytgi.router.params import GenerateParameters


class WireRequest(BaseModel):
    """Request base: unknown keys ignored, `null` on a defaulted field means the default."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if v is not None or k not in fields or fields[k].is_required()
        }


class WireResponse(BaseModel):
    """Response base: drops the keys in `_omit_if_none` when they are None (as TGI does)."""

    _omit_if_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit(self, handler):
        data = handler(self)
        for key in self._omit_if_none:
            if data.get(key) is None:
                data.pop(key, None)
        return data


class GenerateRequest(WireRequest):
    """TGI's routes parse strictly, as serde does (no string or float coercions)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: str = Field(examples=["My name is Olivier and I"])
    parameters: GenerateParameters | None = None

    def generate_parameters(self) -> GenerateParameters:
        """TGI: a request without `parameters` samples (`do_sample=true`); `{}` is greedy."""
        return self.parameters or GenerateParameters.when_absent()


class CompatGenerateRequest(GenerateRequest):
    stream: bool = False


class Details(WireResponse):
    _omit_if_none: ClassVar[frozenset[str]] = frozenset({"top_tokens", "best_of_sequences"})

    finish_reason: str
    generated_tokens: int
    seed: int | None
    prefill: list[PrefillToken]
    tokens: list[Token]
    top_tokens: list[list[Token]] | None = None
    best_of_sequences: list[BestOfSequence] | None = None


class GenerateResponse(WireResponse):
    _omit_if_none: ClassVar[frozenset[str]] = frozenset({"details"})

    generated_text: str
    details: Details | None = None

    @classmethod
    def from_generation(cls, gen: ro.Generation, *, details: bool) -> GenerateResponse:
        if not details:
            return cls(generated_text=gen.generated_text)
        return cls(generated_text=gen.generated_text, details=_details(gen))


def _details(gen: ro.Generation) -> Details:
    return Details(
        finish_reason=gen.finish_reason.value,
        generated_tokens=gen.generated_tokens,
        seed=gen.seed,
        prefill=gen.prefill,
        tokens=gen.tokens,
        top_tokens=gen.top_tokens or None,
        best_of_sequences=gen.best_of_sequences,
    )


class StreamResponse(WireResponse):
    _omit_if_none: ClassVar[frozenset[str]] = frozenset({"top_tokens"})

    index: int
    token: Token
    top_tokens: list[Token] | None = None
    generated_text: str | None = None
    details: StreamDetails | None = None

    @classmethod
    def from_event(cls, event: ro.StreamEvent, *, details: bool) -> StreamResponse:
        return cls(
            index=event.index,
            token=event.token,
            top_tokens=event.top_tokens or None,
            generated_text=event.generated_text,
            details=event.details if details else None,
        )


class ChatTokenizeResponse(WireResponse):
    tokenize_response: list[SimpleToken]
    templated_text: str


class Info(BaseModel):
    """TGI's `/info`, plus pytgi's KV-cache facts (extra keys clients ignore)."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model_id: str
    model_sha: str | None = None
    model_pipeline_tag: str | None = None
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    validation_workers: int
    max_client_batch_size: int
    router: str = "text-generation-router"
    version: str
    sha: str | None = None
    docker_label: str | None = None


class ErrorResponse(BaseModel):
    error: str
    error_type: str
