"""TGI's user-facing generation parameters (`parameters` of `/generate`), as pydantic v2 models.

The server's wire types reuse these. They only check *types*, strictly, as TGI's JSON extractor
(serde) does: `"10"` or `10.0` for an integer and `"yes"` for a boolean are 422s, and a negative
`max_new_tokens` is a deserialization error there too; value rules and TGI's exact messages live
in `router.validation.Validator`. Explicit `null`s are accepted everywhere and mean "default";
unknown keys are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GrammarKind = Literal["json", "json_object", "regex", "json_schema"]


class GrammarParam(BaseModel):
    """TGI's adjacently tagged `GrammarType`: `{"type": ..., "value": ...}`.

    `json` / `json_object` (alias): value is a JSON schema object or a JSON string of one; `regex`:
    value is a regular expression string; `json_schema`: value is `{"name"?, "schema": {...}}`.
    """

    model_config = ConfigDict(extra="ignore")

    type: GrammarKind
    value: Any = None

    @model_validator(mode="before")
    @classmethod
    def _openai_shape(cls, data: Any) -> Any:
        """Also accept OpenAI's `{"type": "json_schema", "json_schema": {"schema": ...}}`."""
        if isinstance(data, dict) and data.get("value") is None and "json_schema" in data:
            return {**data, "value": data["json_schema"]}
        return data


_NULL_DEFAULTS: dict[str, Any] = {
    "do_sample": False,
    "details": False,
    "decoder_input_details": False,
    "watermark": False,
}


class GenerateParameters(BaseModel):
    """Every field of TGI's `GenerateParameters` (TGI_COMPATIBILITY.md §6); `None` = server
    default."""

    model_config = ConfigDict(extra="ignore", strict=True)

    best_of: int | None = Field(default=None, ge=0)
    temperature: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    typical_p: float | None = None
    do_sample: bool = False
    max_new_tokens: int | None = Field(default=None, ge=0)
    return_full_text: bool | None = None
    stop: list[str] = Field(default_factory=list)
    truncate: int | None = Field(default=None, ge=0)
    watermark: bool = False
    details: bool = False
    decoder_input_details: bool = False
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    top_n_tokens: int | None = Field(default=None, ge=0)
    grammar: GrammarParam | None = None
    adapter_id: str | None = None

    @field_validator("do_sample", "details", "decoder_input_details", "watermark", mode="before")
    @classmethod
    def _null_bool(cls, value: Any, info) -> Any:
        return _NULL_DEFAULTS[info.field_name] if value is None else value

    @field_validator("stop", mode="before")
    @classmethod
    def _null_stop(cls, value: Any) -> Any:
        return [] if value is None else value

    @classmethod
    def when_absent(cls) -> GenerateParameters:
        """The parameters TGI uses when a request has no `parameters` object at all: sampling on."""
        return cls(do_sample=True)
