"""The warm-up step: a dummy SchedulerOutput shaped like a busy real step (prefills, decodes)."""

from __future__ import annotations

from pytgi.engine.outputs import ScheduledRequest, SchedulerOutput
from pytgi.engine.sampling_params import SamplingParams

MAX_WARMUP_PREFILL_TOKENS = 4096


def _request(request_id: str, token_ids: list[int], start_pos: int, block_ids: list[int]):
    return ScheduledRequest(
        request_id=request_id,
        input_ids=token_ids[start_pos:],
        start_pos=start_pos,
        block_ids=block_ids,
        sample=True,
        sampling=SamplingParams(),
        prompt_ids=token_ids,
        output_ids=[],
    )


def dummy_scheduler_output(
    num_prefill_tokens: int,
    num_decode_rows: int,
    block_size: int,
    max_position: int,
    vocab_size: int,
) -> tuple[SchedulerOutput, int]:
    """Prompts totalling `num_prefill_tokens` (each within max_position), then decode rows with some
    context; returns the step and the number of KV blocks it needs (its block ids are 0..n-1)."""
    num_blocks = 0

    def take_blocks(num_tokens: int) -> list[int]:
        nonlocal num_blocks
        count = -(-num_tokens // block_size)
        num_blocks += count
        return list(range(num_blocks - count, num_blocks))

    def token_ids(n: int) -> list[int]:
        return [(7 + 31 * j) % vocab_size for j in range(n)]

    requests = []
    remaining = min(num_prefill_tokens, MAX_WARMUP_PREFILL_TOKENS)
    while remaining > 0:
        n = min(remaining, max_position - 1)
        requests.append(
            _request(f"warmup-prefill-{len(requests)}", token_ids(n), 0, take_blocks(n))
        )
        remaining -= n
    context = max(1, min(2 * block_size, max_position - 1))
    for i in range(num_decode_rows):
        ids = token_ids(context + 1)
        requests.append(_request(f"warmup-decode-{i}", ids, context, take_blocks(context + 1)))
    return SchedulerOutput(requests=requests), num_blocks
