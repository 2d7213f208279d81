"""The warm-up step: a dummy SchedulerOutput shaped like a busy real step (prefills, decodes)."""

from __future__ import annotations

from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.utils.math import cdiv

MAX_WARMUP_PREFILL_TOKENS = 4096


def dummy_scheduler_output(
    num_prefill_tokens: int,
    num_decode_rows: int,
    block_size: int,
    max_position: int,
    vocab_size: int,
    num_kv_groups: int = 1,
) -> tuple[SchedulerOutput, int]:
    """Prompts totalling `num_prefill_tokens` (each within max_position), then decode rows with
    some context; returns the step and the number of KV blocks it needs (its block ids are
    0..n-1, the same in every KV group)."""
    output = SchedulerOutput(requests=[])
    num_blocks = 0

    def add(request_id: str, num_tokens: int, start_pos: int) -> None:
        nonlocal num_blocks
        count = cdiv(num_tokens, block_size)
        ids = list(range(num_blocks, num_blocks + count))
        token_ids = [(7 + 31 * j) % vocab_size for j in range(num_tokens)]
        output.new_requests.append(NewRequestData(request_id, token_ids, SamplingParams()))
        output.requests.append(
            ScheduledRequest(
                request_id,
                start_pos,
                num_tokens - start_pos,
                new_block_ids=ids,
                new_group_block_ids=[list(ids) for _ in range(num_kv_groups - 1)],
                sample=True,
                propose_drafts=True,  # a trained speculator's pass counts in the memory plan
            )
        )
        num_blocks += count

    remaining = min(num_prefill_tokens, MAX_WARMUP_PREFILL_TOKENS)
    while remaining > 0:
        n = min(remaining, max_position - 1)
        add(f"warmup-prefill-{len(output.requests)}", n, 0)
        remaining -= n
    context = max(1, min(2 * block_size, max_position - 1))
    for i in range(num_decode_rows):
        add(f"warmup-decode-{i}", context + 1, context)
    return output, num_blocks
