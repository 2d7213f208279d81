"""Runs a workload through pytgi's `EngineCore` directly (no HTTP, no tokenizer).

Every request is submitted before the first step, then the loop steps until all have finished,
timing each `step()` (schedule + forward + update, the engine's real cost) and classifying it from
the engine's own counters: a step that ran any prompt tokens is prefill time, a step that only
decoded is one decode step.
"""

from __future__ import annotations

import time
import uuid

from pytgi.benchmark.engine import contention
from pytgi.benchmark.engine.trace import RequestTrace, RunTrace
from pytgi.benchmark.engine.workloads import Workload
from pytgi.engine.client import EngineStats
from pytgi.engine.engine_core import EngineCore
from pytgi.messages.request import EngineRequest
from pytgi.messages.sampling_params import SamplingParams, StoppingParams
from pytgi.runtime.build import build_engine_core, engine_config


def create_engine(
    model_id: str,
    dtype: str,
    num_threads: int,
    max_batch_prefill_tokens: int | None = None,
    max_batch_size: int | None = None,
    implementation: str = "auto",
    quantize: str | None = None,
    quantize_activations: str | None = None,
) -> EngineCore:
    """The engine with `pytgi serve`'s defaults except the options given here."""
    options = {
        "dtype": dtype,
        "num_threads": num_threads,
        "max_batch_size": max_batch_size,
        "implementation": implementation,
        "quantize": quantize,
        "quantize_activations": quantize_activations,
    }
    if max_batch_prefill_tokens is not None:
        options["max_batch_prefill_tokens"] = max_batch_prefill_tokens
    return build_engine_core(engine_config(model_id, **options))


class PytgiRunner:
    def __init__(self, core: EngineCore, system: str = "pytgi"):
        self.core = core
        self.system = system  # "pytgi", or "pytgi_transformers" for the fallback as a baseline

    def run(self, workload: Workload, prompts: list[list[int]]) -> RunTrace:
        requests = [RequestTrace(r.prompt_len, r.output_len) for r in workload.requests]
        trace = RunTrace(self.system, requests)
        first_stats = before = self.core.stats()
        cpu_start = contention.snapshot()
        start_s = time.perf_counter()
        index = self._submit(workload, prompts)
        while self.core.has_unfinished():
            step_start_s = time.perf_counter()
            outputs = self.core.step()
            now_s = time.perf_counter()
            after = self.core.stats()
            _record_step(trace, before, after, now_s - step_start_s)
            before = after
            for out in outputs:
                if out.error:
                    raise RuntimeError(f"pytgi failed request {out.request_id}: {out.error}")
                trace.requests[index[out.request_id]].token_times_s.extend(
                    [now_s - start_s] * len(out.new_tokens)
                )
        trace.wall_s = time.perf_counter() - start_s
        trace.others = contention.others_fraction(cpu_start, contention.snapshot())
        trace.num_preemptions = before.num_preemptions - first_stats.num_preemptions
        return trace

    def _submit(self, workload: Workload, prompts: list[list[int]]) -> dict[str, int]:
        run_id = uuid.uuid4().hex[:8]
        index = {}
        for i, (spec, prompt_ids) in enumerate(zip(workload.requests, prompts, strict=True)):
            request_id = f"bench-{run_id}-{i}"
            stopping = StoppingParams(max_new_tokens=spec.output_len, ignore_eos_token=True)
            self.core.add_request(EngineRequest(request_id, prompt_ids, SamplingParams(), stopping))
            index[request_id] = i
        return index


def _record_step(trace: RunTrace, before: EngineStats, after: EngineStats, step_s: float) -> None:
    num_prefill = after.num_prefill_tokens - before.num_prefill_tokens
    num_decode = after.num_decode_tokens - before.num_decode_tokens
    if num_prefill > 0:
        trace.num_prefill_tokens += num_prefill
        trace.prefill_time_s += step_s
    elif num_decode > 0:
        trace.num_decode_tokens += num_decode
        trace.decode_time_s += step_s
        trace.decode_step_s.append(step_s)
