"""TGI's response headers (TGI_COMPATIBILITY.md §5): compute type, characters, timings and token
counts.

Times are integer milliseconds except `x-compute-time` (float seconds), as TGI sends them.
`/v1/completions` sums them over its prompts (`HeaderTotals`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pytgi.router.outputs import Timings

DEFAULT_COMPUTE_TYPE = "gpu+optimized"  # TGI's router default when COMPUTE_TYPE is unset


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))


@dataclass
class HeaderTotals:
    """Per-request figures for the `x-*` headers; `add` sums several generations."""

    compute_characters: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    validation_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    total_s: float = 0.0

    def add(self, timings: Timings, *, prompt_tokens: int, generated_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated_tokens
        self.validation_s += timings.validation_s
        self.queue_s += timings.queue_s
        self.inference_s += timings.inference_s
        self.total_s += timings.total_s

    def to_headers(self, compute_type: str) -> dict[str, str]:
        per_token_s = self.inference_s / self.generated_tokens if self.generated_tokens else 0.0
        return {
            "x-compute-type": compute_type,
            "x-compute-time": f"{self.total_s:.6f}",
            "x-compute-characters": str(self.compute_characters),
            "x-total-time": _ms(self.total_s),
            "x-validation-time": _ms(self.validation_s),
            "x-queue-time": _ms(self.queue_s),
            "x-inference-time": _ms(self.inference_s),
            "x-time-per-token": _ms(per_token_s),
            "x-prompt-tokens": str(self.prompt_tokens),
            "x-generated-tokens": str(self.generated_tokens),
        }


def generation_headers(
    compute_type: str, inputs: str, timings: Timings, prompt_tokens: int, generated_tokens: int
) -> dict[str, str]:
    totals = HeaderTotals(compute_characters=len(inputs))
    totals.add(timings, prompt_tokens=prompt_tokens, generated_tokens=generated_tokens)
    return totals.to_headers(compute_type)


def stream_headers(compute_type: str, inputs: str) -> dict[str, str]:
    return {"x-compute-type": compute_type, "x-compute-characters": str(len(inputs))}
