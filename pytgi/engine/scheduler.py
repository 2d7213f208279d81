"""Scheduler: decides, each step, which requests run which tokens, under three budgets.

- token budget: `max_batch_prefill_tokens` tokens per step (decodes cost one each plus their
  draft tokens, prompts are chunked);
- KV budget: blocks from the KVCacheManager (when they run out, the most recently admitted running
  request is preempted: its blocks are freed and it goes back to the front of the queue, to be
  recomputed);
- `max_batch_size` running requests.

There is one piece of arithmetic for every phase: a request runs tokens until
`num_computed_tokens` catches up with `num_tokens`. With speculation, a request at the end of its
history also runs its draft tokens; the workers return the drafts they accepted and one new
token, and the scheduler keeps only the accepted drafts' K/V as computed (rollback). The
scheduler never touches tensors.

A request with a grammar waits in `waiting_for_grammar` until its grammar has compiled (off the
step loop, `GrammarManager`), then joins `waiting`; one whose grammar fails is finished with a
grammar error before any token. Its drafts are cut to what its grammar accepts, its sampled rows
get token masks, and every token appended advances its matcher.

A model with bidirectional spans (messages/bidirectional.py: PaliGemma's whole prompt, Gemma 3's
images) gets each span whole: a chunk that would end inside a span ends before it, or, when the
chunk starts at the span, runs to its end (`_fit_spans`; past the budget only when nothing else
runs in the step), so no row of the workers ever starts or ends inside a span.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import suppress

from pytgi.config import SchedulerConfig
from pytgi.engine.grammar_manager import GrammarManager
from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.request import Request, RequestStatus
from pytgi.engine.speculation import NgramProposer
from pytgi.engine.speculation_policy import SpeculationPolicy
from pytgi.engine.stopping import check_stop, make_delta
from pytgi.messages.bidirectional import span_around
from pytgi.messages.outputs import (
    ErrorKind,
    ModelOutput,
    NewRequestData,
    PendingMasks,
    RequestOutput,
    SampledToken,
    ScheduledRequest,
    SchedulerOutput,
)
from pytgi.messages.request import FinishReason

GRAMMARLESS_ENGINE = "constrained decoding is off in this engine"


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, grammar: GrammarManager | None = None
    ):
        self.config = config
        self.kv = kv
        self.grammar = grammar
        self.waiting_for_grammar: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        ngram = config.num_speculative_tokens and not config.model_drafts
        self.proposer = NgramProposer(config.num_speculative_tokens) if ngram else None
        self.policy = (
            SpeculationPolicy(
                config.num_speculative_tokens, config.speculation_policy, config.model_drafts
            )
            if config.num_speculative_tokens
            else None
        )
        self._freed_ids: list[str] = []
        self._rejected: list[RequestOutput] = []  # grammar failures, reported with the next step
        self.num_preemptions = 0
        self.num_aborts = 0
        self.num_draft_tokens = 0
        self.num_accepted_draft_tokens = 0
        self.num_draft_steps = 0  # request-steps that verified drafts

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        if request.sampling.grammar is None:
            self.waiting.append(request)
        elif self.grammar is None:
            self._reject(request, GRAMMARLESS_ENGINE)
        else:
            self.grammar.submit(request)
            request.status = RequestStatus.WAITING_FOR_GRAMMAR
            self.waiting_for_grammar.append(request)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; frees its blocks now. Returns False if it was unknown."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING_FOR_GRAMMAR:
            self.waiting_for_grammar.remove(request)
        else:
            self.waiting.remove(request)
        self.num_aborts += 1
        self._finish(request, FinishReason.ABORTED)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.waiting_for_grammar or self._rejected)

    def take_rejected(self) -> list[RequestOutput]:
        """The final deltas of requests whose grammar could not be used (since the last call)."""
        rejected, self._rejected = self._rejected, []
        return rejected

    def wait_for_grammars(self, timeout_s: float) -> None:
        """Nothing can run: sleep until a parked request's grammar is compiled (or `timeout_s`)."""
        if self.grammar is not None and self.waiting_for_grammar:
            self.grammar.wait(self.waiting_for_grammar, timeout_s)

    def schedule(self) -> SchedulerOutput:
        if self.waiting_for_grammar:
            self._admit_compiled_grammars()
        budget = self.config.max_batch_prefill_tokens
        output = SchedulerOutput(requests=[])
        num_preemptions = self.num_preemptions
        if self.policy is not None:
            self.policy.begin_step([(r.request_id, len(r.draft_ids)) for r in self.running])
        for request in list(self.running):
            if budget <= 0:
                break
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            num_new = self._fit_spans(request, request.num_computed_tokens, num_new, budget)
            if num_new == 0:
                continue  # its next span waits for a step with room
            reaches_end = request.num_computed_tokens + num_new == request.num_tokens
            drafts = request.draft_ids[: max(0, budget - num_new)] if reaches_end else []
            if drafts and not self.policy.drafts(request.request_id):
                drafts = []  # the speculation policy says they do not pay in this step
            if not self._allocate_or_preempt(request, num_new + len(drafts)):
                continue
            self._add(output, request, num_new, drafts)
            budget -= num_new + len(drafts)
        if self.num_preemptions == num_preemptions:  # no admissions while memory is short
            self._admit_waiting(budget, output)
        output.freed_request_ids, self._freed_ids = self._freed_ids, []
        return output

    def fill_grammar_masks(self, output: SchedulerOutput) -> PendingMasks | None:
        """Start filling the step's grammar masks (None: no grammar row in the step). Until the
        executor has waited for them, no request's matcher may be touched."""
        return self.grammar.fill_masks(output, self.requests) if self.grammar else None

    def _admit_compiled_grammars(self) -> None:
        """Move parked requests whose grammar compiled to the queue; reject the failed ones."""
        ready, failed = self.grammar.poll(self.waiting_for_grammar)
        for request in ready:
            self.waiting_for_grammar.remove(request)
            request.status = RequestStatus.WAITING
            self.waiting.append(request)
        for request, reason in failed:
            self.waiting_for_grammar.remove(request)
            self._reject(request, reason)

    def _reject(self, request: Request, reason: str) -> None:
        self._rejected.append(
            RequestOutput(
                request.request_id, finished=True, error=reason, error_kind=ErrorKind.GRAMMAR
            )
        )
        self._finish(request, FinishReason.ABORTED)

    def _allocate_or_preempt(self, request: Request, num_new: int) -> bool:
        """Allocate slots for `request`, preempting the newest running requests until it fits."""
        while not self.kv.allocate_slots(request, num_new):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _admit_waiting(self, budget: int, output: SchedulerOutput) -> None:
        max_running = self.config.max_batch_size or 1 << 30
        while self.waiting and budget > 0 and len(self.running) < max_running:
            request = self.waiting[0]
            cached = (
                self.kv.find_cached_prefix(request) if request.num_computed_tokens == 0 else None
            )
            num_cached = len(cached) * self.kv.block_size if cached else 0
            num_new = request.num_tokens - request.num_computed_tokens - num_cached
            if num_new > budget and not self.config.enable_chunked_prefill:
                break
            start = request.num_computed_tokens + num_cached
            num_new = self._fit_spans(request, start, min(num_new, budget), budget)
            if num_new == 0:
                break
            if not self.kv.allocate_slots(request, num_new, cached):
                break
            self.waiting.popleft()
            request.num_computed_tokens += num_cached
            request.num_cached_prompt_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time_s is None:
                request.first_scheduled_time_s = time.monotonic()
            self.running.append(request)
            self._add(output, request, num_new, [])
            budget -= num_new

    def _fit_spans(self, request: Request, start: int, num_new: int, budget: int) -> int:
        """`num_new` tokens from `start` (never inside a bidirectional span), moved so the chunk
        does not end inside one either: it stops before a span it would cut, or, starting at
        that span, runs to its end: past the budget only alone in the step (nothing scheduled
        yet: a span longer than the budget). 0: the chunk waits."""
        if not self.kv.bidirectional:
            return num_new
        span = span_around(self.kv.spans(request), start + num_new)
        if span is None:
            return num_new
        span_start, span_end = span
        if span_start > start:
            return span_start - start
        alone = budget == self.config.max_batch_prefill_tokens
        return span_end - start if span_end - start <= budget or alone else 0

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.draft_ids = []
        self._forget_on_workers(request)
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _forget_on_workers(self, request: Request) -> None:
        if request.num_block_ids_sent:
            self._freed_ids.append(request.request_id)
        request.num_output_ids_sent = request.num_block_ids_sent = 0

    def _add(self, output: SchedulerOutput, request: Request, num_new: int, drafts: list[int]):
        """Schedule `num_new` history tokens and `drafts` of `request`, with what the workers do
        not know about it yet."""
        if request.num_block_ids_sent == 0:
            output.new_requests.append(
                NewRequestData(
                    request.request_id,
                    request.prompt_ids,
                    request.sampling,
                    request.adapter_id,
                    request.multimodal_inputs,
                )
            )
        start = request.num_computed_tokens
        end = start + num_new
        sent = request.num_block_ids_sent  # every KV group's table is as long
        new_block_ids = self.kv.block_ids(request.request_id, sent)
        group_block_ids = [
            self.kv.block_ids(request.request_id, sent, g) for g in range(1, self.kv.num_groups)
        ]
        new_token_ids = request.output_ids[request.num_output_ids_sent :]
        request.num_block_ids_sent += len(new_block_ids)
        request.num_output_ids_sent = request.num_output_tokens
        want_prompt_logprobs = (
            request.sampling.prefill_logprobs and not request.prompt_logprobs_sent
        )
        output.requests.append(
            ScheduledRequest(
                request_id=request.request_id,
                start_pos=start,
                num_tokens=num_new,
                new_token_ids=new_token_ids,
                new_block_ids=new_block_ids,
                new_group_block_ids=group_block_ids,
                draft_ids=drafts,
                sample=end == request.num_tokens,
                prefill_logprobs=want_prompt_logprobs and start < request.num_prompt_tokens,
                propose_drafts=self.config.model_drafts and self._proposes(request.request_id),
            )
        )

    def _proposes(self, request_id: str) -> bool:
        return self.policy is not None and self.policy.propose(request_id)

    def update(self, output: SchedulerOutput, model_output: ModelOutput) -> list[RequestOutput]:
        """Apply a step's results: advance, append sampled tokens, stop, free, emit deltas."""
        deltas = []  # the executor waited for the step's masks: the matchers may advance
        for scheduled in output.requests:
            request = self.requests.get(scheduled.request_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted while the step ran
            sampled = model_output.sampled.get(scheduled.request_id) if scheduled.sample else None
            tokens, reason, error = self._append(request, sampled or [])
            num_accepted = max(len(tokens) - 1, 0)  # drafts kept; the last token is new
            self.num_draft_tokens += len(scheduled.draft_ids)
            self.num_accepted_draft_tokens += num_accepted
            self.num_draft_steps += bool(scheduled.draft_ids)
            if scheduled.draft_ids:
                self.policy.record_acceptance(
                    request.request_id, len(scheduled.draft_ids), num_accepted
                )
            request.num_computed_tokens += scheduled.num_tokens + num_accepted
            request.draft_ids = []
            self.kv.cache_computed_blocks(request)
            self.kv.free_out_of_window(request)
            logprobs = model_output.prefill_logprobs.get(scheduled.request_id)
            if logprobs is not None:
                self._gather_prompt_logprobs(request, scheduled.start_pos, logprobs)
            if error is not None:  # its grammar failed (a limit reached): no output from here on
                self.running.remove(request)
                self._finish(request, FinishReason.ABORTED)
                deltas.append(
                    RequestOutput(
                        request.request_id, finished=True, error=error, error_kind=ErrorKind.GRAMMAR
                    )
                )
                continue
            if not tokens:
                continue
            deltas.append(make_delta(request, tokens, reason))
            if reason is not None:
                self.running.remove(request)
                self._finish(request, reason)
            elif self.config.model_drafts or self.proposer is not None:
                room = request.stopping.max_new_tokens - request.num_output_tokens - 1
                proposed = model_output.draft_ids.get(request.request_id, [])
                request.draft_ids = self._propose(request, room, proposed)
        return deltas

    def _propose(self, request: Request, room: int, proposed: list[int]) -> list[int]:
        """Draft tokens for the next step: the trained speculator's (`proposed`, from the
        workers) or n-gram lookup's; a grammar request's are cut at the first one its grammar
        forbids, so every verified row has a mask and the matcher never rolls back."""
        if self.config.model_drafts:
            drafts = proposed[: max(room, 0)]
        else:
            drafts = self.proposer.propose(request, room)
        if drafts and request.grammar is not None:
            drafts = drafts[: request.grammar.count_valid(drafts)]
        return drafts

    @staticmethod
    def _append(
        request: Request, sampled: list[SampledToken]
    ) -> tuple[list[SampledToken], FinishReason | None, str | None]:
        """Append sampled tokens until one stops the request; returns those appended, the finish
        reason, and an error if the request's grammar refused a token (its mask was EOS-only
        because the matcher failed: a lexer limit reached mid-generation, e.g. `a{1000000}`).

        A grammar request also ends where its grammar does (EOS accepted), even with
        `ignore_eos_token`: nothing may follow.
        """
        grammar = request.grammar
        for i, token in enumerate(sampled):
            if grammar is not None and not grammar.accept_token(token.token_id):
                return sampled[:i], None, grammar.error or "the grammar refused a token"
            request.output_ids.append(token.token_id)
            reason = check_stop(request, token.token_id)
            if reason is None and grammar is not None and grammar.is_stopped:
                reason = FinishReason.EOS_TOKEN
            if reason is not None:
                return sampled[: i + 1], reason, None
        return sampled, None, None

    def fail(
        self, output: SchedulerOutput, error: str, grammar_masks: PendingMasks | None = None
    ) -> list[RequestOutput]:
        """The step raised: finish every request it ran with `error` (TGI drops the whole batch),
        once its mask fill, if any, has ended."""
        if grammar_masks is not None:
            with suppress(Exception):  # a failed fill failed this step: `error` says so
                grammar_masks.wait()
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
        ones)."""
        have = len(request.prompt_logprobs)
        skip = have - start_pos
        if skip >= 0:
            request.prompt_logprobs.extend(logprobs[skip : skip + request.num_prompt_tokens - have])

    def _finish(self, request: Request, reason: FinishReason) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.grammar = request.pending_grammar = None
        self.kv.free(request)
        self._forget_on_workers(request)
        if self.proposer is not None:
            self.proposer.free(request.request_id)
        if self.policy is not None:
            self.policy.forget(request.request_id)
        del self.requests[request.request_id]

    @property
    def num_batch_tokens(self) -> int:
        return sum(r.num_tokens for r in self.running)
