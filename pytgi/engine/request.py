"""Engine-side state of one request.

Invariant: `num_computed_tokens <= num_tokens`; the tokens in `[num_computed_tokens, num_tokens)`
are the ones the scheduler still has to run through the model (the prompt, a prompt chunk, the last
sampled token, or everything again after a preemption). Prefill, chunked prefill, prefix hits,
decode and recompute are all this one piece of arithmetic.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytgi.messages.request import EngineRequest, FinishReason, MultimodalInput
from pytgi.messages.sampling_params import SamplingParams, StoppingParams

if TYPE_CHECKING:  # llguidance-backed, loaded only when grammars are on
    from pytgi.grammar import GrammarMatcher, PendingGrammar


class RequestStatus(enum.Enum):
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"  # parked until its grammar has compiled
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """A request inside the engine: its tokens, progress and KV blocks."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stopping: StoppingParams
    arrival_time_s: float
    adapter_id: str | None = None
    multimodal_inputs: tuple[MultimodalInput, ...] = ()
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens served by the prefix cache at admission
    num_preemptions: int = 0
    first_scheduled_time_s: float | None = None
    # prompt logprobs (decoder_input_details), gathered over prefill chunks; a recompute after a
    # preemption does not gather them again
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # what the workers hold of this request: generated tokens and blocks (0 until first scheduled
    # and again after a preemption, which drops the workers' state)
    num_output_ids_sent: int = 0
    num_block_ids_sent: int = 0
    draft_ids: list[int] = field(default_factory=list)  # proposed for the next step
    # constrained decoding: the compile in flight, then the request's own matcher, whose state is
    # always that after `output_ids` (preemption and recompute leave it alone)
    pending_grammar: PendingGrammar | None = None
    grammar: GrammarMatcher | None = None

    @classmethod
    def from_engine_request(cls, req: EngineRequest) -> Request:
        return cls(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            sampling=req.sampling,
            stopping=req.stopping,
            arrival_time_s=req.arrival_time_s,
            adapter_id=req.adapter_id,
            multimodal_inputs=req.multimodal_inputs,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without concatenating the whole history."""
        num_prompt = len(self.prompt_ids)
        if end <= num_prompt:
            return self.prompt_ids[start:end]
        if start >= num_prompt:
            return self.output_ids[start - num_prompt : end - num_prompt]
        return self.prompt_ids[start:] + self.output_ids[: end - num_prompt]
