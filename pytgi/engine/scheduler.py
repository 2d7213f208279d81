"""Scheduler: decides, each step, which requests run which tokens, under three budgets.

- token budget: `max_batch_prefill_tokens` tokens per step (decodes cost one each, prompts are
chunked); - KV budget: blocks from the KVCacheManager (when they run out, the most recently admitted
running request is preempted: its blocks are freed and it goes back to the front of the queue, to be
recomputed); - `max_batch_size` running requests. There is one piece of arithmetic for every phase:
a request runs tokens until `num_computed_tokens` catches up with `num_tokens`. The scheduler never
touches tensors.
"""

from __future__ import annotations

import time
from collections import deque

from pytgi.config import SchedulerConfig
from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.outputs import ModelOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from pytgi.engine.request import FinishReason, Request, RequestStatus
from pytgi.engine.stopping import check_stop, make_delta


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: list[str] = []
        self.num_preemptions = 0
        self.num_aborts = 0

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; frees its blocks now. Returns False if it was unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self.num_aborts += 1
        self._finish(request, FinishReason.ABORTED)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_batch_prefill_tokens
        scheduled: list[ScheduledRequest] = []
        num_preemptions = self.num_preemptions
        for request in list(self.running):
            if budget == 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new):
                continue
            scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        if self.num_preemptions == num_preemptions:  # no admissions while memory is short
            self._admit_waiting(budget, scheduled)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(requests=scheduled, finished_request_ids=finished)

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Allocate slots for `request`, preempting the newest running requests until it fits."""
        while not self.kv.allocate_slots(request, num_new):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> None:
        max_running = self.config.max_batch_size or 1 << 30
        while self.waiting and budget > 0 and len(self.running) < max_running:
            request = self.waiting[0]
            cached = self.kv.find_cached_prefix(request) if request.num_computed_tokens == 0 else []
            num_cached = len(cached) * self.kv.block_size
            num_new = request.num_tokens - request.num_computed_tokens - num_cached
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            num_new = min(num_new, budget)
            if not self.kv.allocate_slots(request, num_new, cached):
                break
            self.waiting.popleft()
            request.num_computed_tokens += num_cached
            request.num_cached_prompt_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time_s is None:
                request.first_scheduled_time_s = time.monotonic()
            self.running.append(request)
            scheduled.append(self._scheduled(request, num_new))
            budget -= num_new

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        end = start + num_new
        want_prompt_logprobs = (
            request.sampling.prefill_logprobs and not request.prompt_logprobs_sent
        )
        return ScheduledRequest(
            request_id=request.request_id,
            input_ids=request.all_token_ids[start:end],
            start_pos=start,
            block_ids=self.kv.block_ids(request.request_id),
            sample=end == request.num_tokens,
            sampling=request.sampling,
            prompt_ids=request.prompt_ids,
            output_ids=request.output_ids,
            prefill_logprobs=want_prompt_logprobs and start < request.num_prompt_tokens,
        )

    def update(self, output: SchedulerOutput, model_output: ModelOutput) -> list[RequestOutput]:
        """Apply a step's results: advance, append sampled tokens, stop, free, emit deltas."""
        deltas = []
        for scheduled in output.requests:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            request.num_computed_tokens += scheduled.num_tokens
            self.kv.cache_computed_blocks(request)
            logprobs = model_output.prefill_logprobs.get(scheduled.request_id)
            if logprobs is not None:
                self._gather_prompt_logprobs(request, scheduled.start_pos, logprobs)
            sampled = model_output.sampled.get(scheduled.request_id)
            if not scheduled.sample or sampled is None:
                continue
            request.output_ids.append(sampled.token_id)
            reason = check_stop(request, sampled.token_id)
            deltas.append(make_delta(request, sampled, reason))
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason)
        return deltas

    def fail(self, output: SchedulerOutput, error: str) -> list[RequestOutput]:
        """The step raised: finish every request it ran with `error` (TGI drops the whole batch)."""
        deltas = []
        for scheduled in output.requests:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue
            self.running.remove(request)
            self._finish(request, FinishReason.ABORTED)
            deltas.append(RequestOutput(request.request_id, finished=True, error=error))
        return deltas

    def _gather_prompt_logprobs(
        self, request: Request, start_pos: int, logprobs: list[float]
    ) -> None:
        """Keep the logprobs of prompt positions not gathered yet (a recompute repeats earlier
        ones).
        """
        have = len(request.prompt_logprobs)
        skip = have - start_pos
        if skip >= 0:
            request.prompt_logprobs.extend(logprobs[skip : skip + request.num_prompt_tokens - have])

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.kv.free(request)
        del self.requests[request.request_id]
        self._finished_ids.append(request.request_id)

    @property
    def num_batch_tokens(self) -> int:
        return sum(r.num_tokens for r in self.running)
