"""The workers' copy of each request: its token history and block table, kept across steps.

`RequestStates.update(scheduler_output)` applies a step's changes in the contract's order: drop
freed requests, add new ones, append each scheduled request's new tokens and blocks. It is plain
Python (no torch), so the engine's model-free test executor keeps state the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.request import MultimodalInput
from pytgi.messages.sampling_params import SamplingParams


@dataclass
class RequestState:
    request_id: str
    sampling: SamplingParams
    token_ids: list[int]  # prompt, then generated tokens (never draft tokens)
    num_prompt_tokens: int
    block_ids: list[int] = field(default_factory=list)
    # KV groups 1..'s tables (a model mixing windowed and full layers), as long as block_ids
    group_block_ids: list[list[int]] = field(default_factory=list)
    adapter_id: str | None = None
    multimodal_inputs: tuple[MultimodalInput, ...] = ()

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def group_table(self, group: int) -> list[int]:
        """KV group `group`'s block ids. A request whose steps named one table (model tests
        driving the runner directly) has the same ids in every group's caches."""
        if group == 0 or not self.group_block_ids:
            return self.block_ids
        return self.group_block_ids[group - 1]

    def slot(self, position: int, block_size: int) -> int:
        return self.block_ids[position // block_size] * block_size + position % block_size

    def step_token_ids(self, scheduled: ScheduledRequest) -> list[int]:
        """The tokens the model runs for `scheduled`: history tokens, then the drafts."""
        end = scheduled.start_pos + scheduled.num_tokens
        assert end <= len(self.token_ids), f"{self.request_id}: history ends before {end}"
        return self.token_ids[scheduled.start_pos : end] + scheduled.draft_ids


class RequestStates(dict[str, RequestState]):
    def update(self, scheduler_output: SchedulerOutput) -> None:
        for request_id in scheduler_output.freed_request_ids:
            self.pop(request_id, None)
        for new in scheduler_output.new_requests:
            self[new.request_id] = _state(new)
        for scheduled in scheduler_output.requests:
            state = self[scheduled.request_id]
            state.token_ids.extend(scheduled.new_token_ids)
            state.block_ids.extend(scheduled.new_block_ids)
            for g, ids in enumerate(scheduled.new_group_block_ids):
                if g == len(state.group_block_ids):
                    state.group_block_ids.append([])
                state.group_block_ids[g].extend(ids)


def _state(new: NewRequestData) -> RequestState:
    return RequestState(
        request_id=new.request_id,
        sampling=new.sampling,
        token_ids=list(new.prompt_ids),
        num_prompt_tokens=len(new.prompt_ids),
        adapter_id=new.adapter_id,
        multimodal_inputs=new.multimodal_inputs,
    )
