"""EngineCore: the step loop. `step()` = schedule → execute → update; keep it that short. (A step
with grammar rows also starts filling their token masks, which the executor waits for before it
samples.)

Single-threaded by design: requests and aborts arrive between steps (the clients queue them), so the
scheduler's state never changes while a step runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pytgi.config import CacheInfo, EngineConfig
from pytgi.engine.client import EngineStats
from pytgi.engine.grammar_manager import GrammarManager
from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.request import Request
from pytgi.engine.scheduler import Scheduler
from pytgi.errors import EngineDeadError
from pytgi.messages.executor import Executor
from pytgi.messages.outputs import RequestOutput, SchedulerOutput
from pytgi.messages.request import EngineRequest

logger = logging.getLogger(__name__)

# with only grammar compiles pending, how long a step sleeps on them before new commands are read
GRAMMAR_WAIT_S = 0.02


class EngineCore:
    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        cache_info: CacheInfo,
        grammar: GrammarManager | None = None,
    ):
        self.config = config
        self.executor = executor
        self.grammar = grammar
        self.cache_info = replace(cache_info, supports_grammar=grammar is not None)
        kv = KVCacheManager(
            cache_info.num_blocks,
            cache_info.block_size,
            config.cache.enable_prefix_caching,
            cache_info.sliding_window,
            cache_info.bidirectional,
            cache_info.kv_groups or None,
        )
        self.scheduler = Scheduler(config.scheduler, kv, grammar)
        self._stats = EngineStats(num_kv_blocks=cache_info.num_blocks)

    @classmethod
    def start(
        cls, config: EngineConfig, executor: Executor, model_dir: Callable[[], Path]
    ) -> EngineCore:
        """Initialise `executor` (load, warm up, size the KV cache) and build the engine around
        it. Whoever builds the engine chooses the executor and says where the model's local
        directory is (`model_dir()`: its tokenizer serves the grammars)
        (pytgi.runtime.build_engine_core)."""
        cache_info = executor.initialize()
        try:
            grammar = GrammarManager.from_config(config, cache_info.vocab_size, model_dir)
        except BaseException:
            executor.shutdown()
            raise
        return cls(config, executor, cache_info, grammar)

    def add_request(self, request: EngineRequest) -> None:
        self.scheduler.add_request(Request.from_engine_request(request))

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self._release_when_idle()

    def _release_when_idle(self) -> None:
        """With no work left, tell the workers now which requests are gone (they learn it with
        the next step otherwise), so per-request state there (a cross-attention model's image
        keys and values) is not held while the engine idles."""
        if self.scheduler.has_unfinished():
            return
        idle = self.scheduler.schedule()  # nothing to run: only the freed request ids
        if idle.freed_request_ids:
            self.executor.execute(idle)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        scheduler_output = self.scheduler.schedule()
        rejected = self.scheduler.take_rejected()  # grammars that failed to compile
        if scheduler_output.is_empty:
            self.scheduler.wait_for_grammars(GRAMMAR_WAIT_S)  # if only compiles are pending
            return rejected
        masks = self.scheduler.fill_grammar_masks(scheduler_output)  # filled during the forward
        start = time.perf_counter()
        try:
            model_output = self.executor.execute(scheduler_output, masks)
        except EngineDeadError:  # a shard is gone or out of step: no later step can run
            raise
        except Exception as exc:  # a failed forward fails its batch, not the engine
            logger.exception("step failed")
            error = f"{type(exc).__name__}: {exc}"
            return rejected + self.scheduler.fail(scheduler_output, error, masks)
        self._record(scheduler_output, time.perf_counter() - start)
        outputs = rejected + self.scheduler.update(scheduler_output, model_output)
        self._release_when_idle()
        return outputs

    def _record(self, output: SchedulerOutput, elapsed_s: float) -> None:
        stats = self._stats
        stats.num_steps += 1
        stats.forward_time_s += elapsed_s
        stats.num_batch_tokens = output.num_tokens
        if self.scheduler.policy is not None:
            self.scheduler.policy.record_step(output, elapsed_s)
        for scheduled in output.requests:
            request = self.scheduler.requests[scheduled.request_id]  # update() has not run yet
            is_decode = (
                scheduled.num_tokens == 1 and scheduled.start_pos >= request.num_prompt_tokens
            )
            if is_decode:
                stats.num_decode_tokens += scheduled.num_scheduled_tokens
            else:
                stats.num_prefill_tokens += scheduled.num_scheduled_tokens

    def stats(self) -> EngineStats:
        scheduler, kv = self.scheduler, self.scheduler.kv
        stats = self._stats
        stats.num_running = len(scheduler.running)
        stats.num_waiting = len(scheduler.waiting) + len(scheduler.waiting_for_grammar)
        stats.num_free_kv_blocks = kv.num_free_blocks
        stats.prefix_cache_queried_tokens = kv.num_queried_tokens
        stats.prefix_cache_hit_tokens = kv.num_hit_tokens
        stats.num_preemptions = scheduler.num_preemptions
        stats.num_aborts = scheduler.num_aborts
        stats.num_draft_tokens = scheduler.num_draft_tokens
        stats.num_accepted_draft_tokens = scheduler.num_accepted_draft_tokens
        stats.num_draft_steps = scheduler.num_draft_steps
        if scheduler.policy is not None:
            stats.num_speculation_steps_drafted = scheduler.policy.num_steps_drafted
            stats.num_speculation_steps_skipped = scheduler.policy.num_steps_skipped
        return EngineStats(**vars(stats))

    def shutdown(self) -> None:
        if self.grammar is not None:
            self.grammar.close()
        self.executor.shutdown()
