"""The objects that cross the engine's boundaries.

Scheduler → workers: `SchedulerOutput`. The workers keep each request's token history and block
table across steps: a request's first step (or its first after a preemption) brings
`NewRequestData` (prompt, parameters), and every step brings only what changed since
(`ScheduledRequest.new_token_ids`, `new_block_ids`), so a step costs O(new tokens), not
O(context). A scheduled request may carry draft tokens to verify. Workers → scheduler:
`ModelOutput` (per request, the accepted draft tokens then one new token). Engine → API process:
`RequestOutput` (per-request deltas). All are plain dataclasses of Python scalars, lists and
numpy arrays: picklable, no torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pytgi.messages.request import FinishReason, MultimodalInput
from pytgi.messages.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np


@dataclass
class NewRequestData:
    """What the workers keep for a request from its first step until it is freed."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    adapter_id: str | None = None
    multimodal_inputs: tuple[MultimodalInput, ...] = ()


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    The workers append `new_token_ids` to the request's history (prompt, then generated tokens)
    and `new_block_ids` to its block table (`new_group_block_ids[g - 1]` to KV group g's, each
    group's layers in their own cache blocks). The model then runs history tokens
    [start_pos, start_pos + num_tokens) followed by `draft_ids` (positions continue), writing
    their K/V at slot = block_table[pos // block_size] * block_size + pos % block_size, each
    attending to every earlier position (the cache holds `start_pos` tokens already).
    With `sample`, the step reaches the end of the history: the workers sample the next token at
    the last history token and at each draft token, and keep drafts while they agree.
    A request with a grammar also has `grammar_bitmask`, int32 [1 + len(draft_ids), ceil(V / 32)]:
    row j allows the tokens the grammar accepts after the first j drafts (bit t % 32 of word
    t // 32 for token t). Only rank 0's sampler reads it; tensor-parallel ranks never see it.
    """

    request_id: str
    start_pos: int
    num_tokens: int
    new_token_ids: list[int] = field(default_factory=list)
    new_block_ids: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)
    sample: bool = False
    prefill_logprobs: bool = False  # return logprobs for the prompt tokens run in this step
    grammar_bitmask: np.ndarray | None = None
    # KV groups 1.. (a model mixing windowed and full layers): each group's new block ids, as
    # many as `new_block_ids` (the tables cover the same positions); `new_block_ids` is group 0's
    new_group_block_ids: list[list[int]] = field(default_factory=list)
    # a trained speculator (rank 0) drafts for the request's next step (the engine's speculation
    # policy leaves it off for steps that will not verify drafts)
    propose_drafts: bool = False

    @property
    def num_scheduled_tokens(self) -> int:
        return self.num_tokens + len(self.draft_ids)


@dataclass
class SchedulerOutput:
    """Everything the workers need for one forward step, in batch order."""

    requests: list[ScheduledRequest]
    new_requests: list[NewRequestData] = field(default_factory=list)
    # requests whose worker state is dropped before this step (finished, aborted, preempted)
    freed_request_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_scheduled_tokens for r in self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests


class PendingMasks(Protocol):
    """A step's grammar token masks (its requests' `grammar_bitmask` rows), filled on another
    thread while the forward runs. The engine's GrammarManager makes one per step that has
    grammar rows and the engine hands it to the executor beside the step; rank 0 waits for it
    once, before its sampler reads the rows. It never crosses a process boundary."""

    def wait(self) -> None:
        """Block until the rows are filled (re-raises what the fill raised)."""


@dataclass
class SampledToken:
    token_id: int
    logprob: float
    top_ids: list[int] = field(default_factory=list)  # top_n_tokens alternatives, best first
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class ModelOutput:
    """Results of one step, keyed by request id.

    `sampled[rid]` holds the accepted draft tokens, then the one new token (a single token without
    drafts). `prefill_logprobs[rid][i]` is the logprob of the i-th input token of this step's chunk
    given what came before it (NaN for the very first prompt token, which has no prediction).
    """

    sampled: dict[str, list[SampledToken]] = field(default_factory=dict)
    prefill_logprobs: dict[str, list[float]] = field(default_factory=dict)
    # a trained speculator's draft tokens after each request's newest token (for the next step)
    draft_ids: dict[str, list[int]] = field(default_factory=dict)


class ErrorKind(str, enum.Enum):
    """Why the engine failed a request (`RequestOutput.error`)."""

    GENERATION = "generation"  # the step failed (TGI's 424 "Request failed during generation")
    # its grammar failed: at compile (against the vocabulary, before any token) or at a limit
    # while generating (e.g. too many lexer states): the router's 422 with TGI's grammar texts
    GRAMMAR = "grammar"


@dataclass
class RequestOutput:
    """A delta for one request: what happened to it in the last step(s)."""

    request_id: str
    new_tokens: list[SampledToken] = field(default_factory=list)
    # prompt logprobs (first token NaN), delivered once, with the first generated token
    prefill_logprobs: list[float] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    error: str | None = None  # set when the engine failed this request
    error_kind: ErrorKind = ErrorKind.GENERATION
    queue_time_s: float = 0.0  # arrival → first scheduled (set on the first delta)
