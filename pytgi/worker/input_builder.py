"""SchedulerOutput -> ForwardBatch: the flat, ragged tensors of one step, rebuilt from scratch each
step.

Token order inside the batch is the worker's business: rows with a single query token (decodes) go
first so attention can batch them (see `backends.base.AttentionBatch`), prefill rows follow. Logits
rows are listed in the scheduler's request order, so sampled outputs line up with `requests`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytgi.backends.base import AttentionBatch
from pytgi.engine.outputs import ScheduledRequest, SchedulerOutput


@dataclass
class LogprobRow:
    """A request that asked for prefill logprobs: its tokens are flat rows [start, start + num)."""

    request: ScheduledRequest
    start: int
    num_tokens: int


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionBatch
    sample_indices: torch.Tensor  # [S] int64: flat row of each sampled request's last token
    sampled_requests: list[ScheduledRequest]  # scheduler order, aligned with sample_indices
    logprob_rows: list[LogprobRow]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


class InputBuilder:
    def __init__(self, block_size: int):
        self.block_size = block_size

    def _slots(self, r: ScheduledRequest) -> list[int]:
        bs, blocks = self.block_size, r.block_ids
        end = r.start_pos + r.num_tokens
        assert len(blocks) * bs >= end, f"{r.request_id}: {len(blocks)} blocks for {end} tokens"
        return [blocks[p // bs] * bs + p % bs for p in range(r.start_pos, end)]

    def build(self, scheduler_output: SchedulerOutput) -> ForwardBatch:
        requests = scheduler_output.requests
        assert requests, "empty step"
        order = sorted(range(len(requests)), key=lambda i: requests[i].num_tokens > 1)
        input_ids, positions, slots, starts = [], [], [], [0] * len(requests)
        for i in order:
            r = requests[i]
            starts[i] = len(input_ids)
            input_ids.extend(r.input_ids)
            positions.extend(range(r.start_pos, r.start_pos + r.num_tokens))
            slots.extend(self._slots(r))
        rows = [requests[i] for i in order]
        attn = AttentionBatch(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_starts=[starts[i] for i in order],
            num_queries=[r.num_tokens for r in rows],
            start_positions=[r.start_pos for r in rows],
            block_tables=[r.block_ids for r in rows],
            block_size=self.block_size,
            num_decode_rows=sum(r.num_tokens == 1 for r in rows),
        )
        sampled = [i for i, r in enumerate(requests) if r.sample]
        return ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            attn=attn,
            sample_indices=torch.tensor(
                [starts[i] + requests[i].num_tokens - 1 for i in sampled], dtype=torch.int64
            ),
            sampled_requests=[requests[i] for i in sampled],
            logprob_rows=[
                LogprobRow(r, starts[i], r.num_tokens)
                for i, r in enumerate(requests)
                if r.prefill_logprobs
            ],
        )
