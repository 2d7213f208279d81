"""Engine-side state of one request.

Invariant: `num_computed_tokens <= num_tokens`; the tokens in `[num_computed_tokens, num_tokens)`
are the ones the scheduler still has to run through the model (the prompt, a prompt chunk, the last
sampled token, or everything again after a preemption). Prefill, chunked prefill, prefix hits,
decode and recompute are all this one piece of arithmetic.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pytgi.engine.sampling_params import SamplingParams, StoppingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """TGI's finish reasons (wire values)."""

    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    ABORTED = (
        "aborted"  # client gone or stop string matched by the router; never reported to a client
    )


@dataclass
class EngineRequest:
    """What the API process submits: token ids and parameters, never text."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stopping: StoppingParams = field(default_factory=StoppingParams)
    arrival_time_s: float = field(default_factory=time.monotonic)


@dataclass
class Request:
    """A request inside the engine: its tokens, progress and KV blocks."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stopping: StoppingParams
    arrival_time_s: float
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = (
        0  # prompt tokens served by the prefix cache at the last admission
    )
    num_preemptions: int = 0
    first_scheduled_time_s: float | None = None
    # prompt logprobs (decoder_input_details), gathered over prefill chunks; a recompute after a
    # preemption does not gather them again
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_logprobs_sent: bool = False

    @classmethod
    def from_engine_request(cls, req: EngineRequest) -> Request:
        return cls(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            sampling=req.sampling,
            stopping=req.stopping,
            arrival_time_s=req.arrival_time_s,
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

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED
