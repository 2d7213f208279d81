"""Per-request generation parameters, as the engine sees them.

The router validates user input and builds these; the engine and the sampler trust them.
They are plain picklable dataclasses so they cross the API/engine process boundary as-is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class GrammarSpec:
    """A validated output constraint: a JSON schema (kind "json") or a regular expression ("regex").

    Frozen and hashable, so it keys the engine's compile cache and pickles across processes: a
    schema is held as canonical JSON text (compact separators, key order kept: the order of
    `properties` is the order the output writes them). `strict=False` (OpenAI's `json_schema`
    with `strict: false`) lets the grammar engine ignore schema keywords it cannot enforce
    instead of refusing them. Regexes must match the whole output.
    """

    kind: Literal["json", "regex"]
    value: str
    strict: bool = True

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any], *, strict: bool = True) -> GrammarSpec:
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
        return cls("json", text, strict)

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern)

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema (kind "json" only)."""
        assert self.kind == "json", self.kind
        return json.loads(self.value)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen (TGI `parameters`, TGI_COMPATIBILITY.md §6, §13).

    As TGI: a request with temperature != 1, top_k, top_p < 1 or typical_p < 1 samples even when
    the user said do_sample=false (`do_sample` is resolved here, once). A sampling request from the
    router always has a `seed` (it draws one when the user gave none), so sampling is
    reproducible.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    typical_p: float = 1.0  # 1.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off
    frequency_penalty: float = 0.0  # 0.0 = off
    watermark: bool = False
    seed: int | None = None
    top_n_tokens: int = 0  # how many alternatives to report per generated token
    prefill_logprobs: bool = False  # logprobs of the prompt tokens (decoder_input_details)
    grammar: GrammarSpec | None = None  # constrained decoding (grammar, response_format, tools)

    def __post_init__(self):
        if self.uses_warpers and not self.do_sample:
            object.__setattr__(self, "do_sample", True)

    @property
    def uses_warpers(self) -> bool:
        return self.temperature != 1.0 or self.top_k > 0 or self.top_p < 1.0 or self.typical_p < 1.0


@dataclass(frozen=True)
class StoppingParams:
    """When the engine stops generating (token-level; stop *strings* are matched by the router)."""

    max_new_tokens: int = 20
    eos_token_ids: tuple[int, ...] = ()
    ignore_eos_token: bool = False
    stop_token_ids: tuple[int, ...] = field(default=())
