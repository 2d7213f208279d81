"""How many blocks a window group of the KV cache needs (docs/KV_CACHE.md, "KV groups").

A windowed group's request holds, after each step, the blocks of its last W - 1 positions
(at most cdiv(W - 1, block_size) + 1 blocks; older ones go back to the pool), and during a step
also the blocks of the tokens the step writes (a step writes at most `max_batch_prefill_tokens`
tokens over all its requests, drafts included, each request's starting in a partly filled block;
a model with bidirectional prompts runs a prompt whole, so there a step may write the context).
A request may also keep the blocks of draft tokens its last step rejected (up to k with
--speculate k). So `max_running` requests never need more than
    max_running * (cdiv(W - 1 + k, block_size) + 2) + cdiv(step_tokens, block_size)
blocks; the window group gets that many (never more than the full group), and the full group the
rest of the budget. More running requests than that may wait for window blocks (the scheduler
admits a request only when every group has room, and preempts as usual).
"""

from __future__ import annotations

from pytgi.utils.math import cdiv

# running requests a window group is sized for when --max-batch-size is not given: the router's
# default --max-concurrent-requests (generations in flight at once)
DEFAULT_MAX_RUNNING = 128


def window_group_blocks(
    window: int, block_size: int, max_running: int | None, step_tokens: int, draft_tokens: int = 0
) -> int:
    running = max_running or DEFAULT_MAX_RUNNING
    per_request = cdiv(window - 1 + draft_tokens, block_size) + 2
    return running * per_request + cdiv(step_tokens, block_size)
