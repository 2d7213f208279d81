"""The objects that cross the engine's boundaries.

Scheduler → worker: `SchedulerOutput` (which requests run which tokens this step, with their block
tables). Worker → scheduler: `ModelOutput` (the sampled token per request that reached the end of
its known tokens). Engine → API process: `RequestOutput` (per-request deltas: new tokens, finish,
prefill logprobs). All are plain dataclasses of Python scalars and lists: picklable, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytgi.engine.request import FinishReason
from pytgi.engine.sampling_params import SamplingParams


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    The model runs `input_ids` at positions `start_pos .. start_pos + len(input_ids) - 1`, writing
    their K/V into the slots given by `block_ids` (slot = block_ids[pos // block_size] * block_size
    + pos % block_size) and attending to every earlier position of the request (its cache holds
    `start_pos` tokens already).
    """

    request_id: str
    input_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool  # this step reaches the request's last known token: sample the next one
    sampling: SamplingParams
    # token history for penalties, watermark and seeded sampling (prompt, then generated so far)
    prompt_ids: list[int]
    output_ids: list[int]
    prefill_logprobs: bool = False  # return logprobs for the prompt tokens run in this step

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class SchedulerOutput:
    """Everything the workers need for one forward step, in batch order."""

    requests: list[ScheduledRequest]
    finished_request_ids: list[str] = field(default_factory=list)  # free per-request worker state

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_ids: list[int] = field(default_factory=list)  # top_n_tokens alternatives, best first
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class ModelOutput:
    """Results of one step, keyed by request id.

    `prefill_logprobs[rid][i]` is the logprob of the i-th input token of this step's chunk given
    what came before it (NaN for the very first prompt token, which has no prediction).
    """

    sampled: dict[str, SampledToken] = field(default_factory=dict)
    prefill_logprobs: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class TokenOutput:
    token_id: int
    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class RequestOutput:
    """A delta for one request: what happened to it in the last step(s)."""

    request_id: str
    new_tokens: list[TokenOutput] = field(default_factory=list)
    # prompt logprobs (first token NaN), delivered once, with the first generated token
    prefill_logprobs: list[float] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    error: str | None = None  # set when the engine failed this request (generation error)
    queue_time_s: float = 0.0  # arrival → first scheduled (set on the first delta)
