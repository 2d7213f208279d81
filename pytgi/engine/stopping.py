"""Token-level stopping (TGI order: max_new_tokens wins over EOS) and the per-step delta of a
request.
"""

from __future__ import annotations

import time

from pytgi.engine.request import Request
from pytgi.messages.outputs import RequestOutput, SampledToken
from pytgi.messages.request import FinishReason


def check_stop(request: Request, token_id: int) -> FinishReason | None:
    stopping = request.stopping
    if request.num_output_tokens >= stopping.max_new_tokens:
        return FinishReason.LENGTH
    if not stopping.ignore_eos_token and token_id in stopping.eos_token_ids:
        return FinishReason.EOS_TOKEN
    if token_id in stopping.stop_token_ids:
        return FinishReason.EOS_TOKEN
    return None


def make_delta(
    request: Request, tokens: list[SampledToken], reason: FinishReason | None
) -> RequestOutput:
    """The delta of a step that appended `tokens` (already in request.output_ids)."""
    delta = RequestOutput(
        request_id=request.request_id,
        new_tokens=tokens,
        finished=reason is not None,
        finish_reason=reason,
        num_prompt_tokens=request.num_prompt_tokens,
        num_cached_tokens=request.num_cached_prompt_tokens,
    )
    if request.num_output_tokens == len(tokens):  # the request's first tokens
        first = request.first_scheduled_time_s or time.monotonic()
        delta.queue_time_s = first - request.arrival_time_s
    if request.sampling.prefill_logprobs and not request.prompt_logprobs_sent:
        delta.prefill_logprobs = request.prompt_logprobs
        request.prompt_logprobs_sent = True
    return delta
