"""The baseline: Hugging Face transformers `generate` on the same checkpoint, prompts and threads.

Two ways to serve a workload without continuous batching:
- sequential: one request at a time, in order (later requests wait, as on such a server);
- static: one padded batch (left padding + attention mask) that runs until the longest output
  is done.
Greedy, EOS suppressed with `min_new_tokens = max_new_tokens`, so every request gets its full
output. Token times come from a streamer that stamps every forward's tokens.

When all requests are identical (same prompt and output length) the sequential run may measure
only the first `sequential_sample` of them and replay those timings for the rest, one after the
other: one-at-a-time cost is linear in the number of such requests, and this saves minutes.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer

from pytgi.benchmark.engine import contention
from pytgi.benchmark.engine.trace import RequestTrace, RunTrace
from pytgi.benchmark.engine.workloads import Workload


class _StepClock(BaseStreamer):
    """Records when each forward's tokens come out (the first `put` is the prompt)."""

    def __init__(self):
        self.times_s: list[float] = []
        self._saw_prompt = False

    def put(self, value) -> None:
        if self._saw_prompt:
            self.times_s.append(time.perf_counter())
        self._saw_prompt = True

    def end(self) -> None:
        pass


class HfRunner:
    def __init__(
        self, model_dir: Path, dtype: str, sequential_sample: int = 0, device: str = "cpu"
    ):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from pytgi.models.gguf.prepared import gguf_source

        hf_logging.set_verbosity_error()  # no per-call warnings in the benchmark's output
        gguf = gguf_source(model_dir)  # a GGUF model: transformers dequantizes the file itself
        source = {"gguf_file": gguf.name} if gguf is not None else {}
        where = gguf.parent if gguf is not None else model_dir
        self.model = AutoModelForCausalLM.from_pretrained(
            where, dtype=getattr(torch, dtype), **source
        )
        self.model.to(device=device, dtype=getattr(torch, dtype)).eval()
        self.device = device
        config = self.model.generation_config
        candidates = (config.pad_token_id, _first(config.eos_token_id), 0)
        self.pad_id = next(i for i in candidates if i is not None)
        self.attn_implementation = self.model.config._attn_implementation
        self.sequential_sample = sequential_sample  # 0: always run every request

    def run_sequential(self, workload: Workload, prompts: list[list[int]]) -> RunTrace:
        trace = _new_trace("hf_sequential", workload)
        num_measured = self._num_to_measure(workload)
        spans_s = []  # (start, end) of each measured request
        cpu_start, start_s = contention.snapshot(), time.perf_counter()
        for request, prompt_ids in zip(trace.requests[:num_measured], prompts, strict=False):
            request_start_s = time.perf_counter() - start_s
            times_s = self._generate([prompt_ids], request.output_len)
            request.token_times_s = [t - start_s for t in times_s]
            _add_phases(trace, [request], request_start_s, request.token_times_s)
            spans_s.append((request_start_s, time.perf_counter() - start_s))
        return _finish(trace, start_s, cpu_start, replayed_s=_replay(trace, spans_s))

    def _num_to_measure(self, workload: Workload) -> int:
        identical = len(set(workload.requests)) == 1
        if not identical or self.sequential_sample <= 0:
            return len(workload.requests)
        return min(self.sequential_sample, len(workload.requests))

    def run_static(self, workload: Workload, prompts: list[list[int]]) -> RunTrace:
        trace = _new_trace("hf_static", workload)
        max_output = max(r.output_len for r in trace.requests)
        cpu_start, start_s = contention.snapshot(), time.perf_counter()
        times_s = [t - start_s for t in self._generate(prompts, max_output)]
        for request in trace.requests:
            request.token_times_s = times_s[: request.output_len]
        _add_phases(trace, trace.requests, 0.0, times_s)
        return _finish(trace, start_s, cpu_start)

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], num_new_tokens: int) -> list[float]:
        input_ids, attention_mask = (t.to(self.device) for t in self._left_pad(prompts))
        clock = _StepClock()  # generate hands it each step's tokens on the CPU (a device sync)
        self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=num_new_tokens,
            min_new_tokens=num_new_tokens,
            do_sample=False,
            pad_token_id=self.pad_id,
            streamer=clock,
        )
        return clock.times_s

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # [B, T]
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # [B, T]
        for row, prompt_ids in enumerate(prompts):
            input_ids[row, width - len(prompt_ids) :] = torch.tensor(prompt_ids)
            attention_mask[row, width - len(prompt_ids) :] = 1
        return input_ids, attention_mask


def _first(value):
    return value[0] if isinstance(value, list) else value


def _new_trace(system: str, workload: Workload) -> RunTrace:
    return RunTrace(system, [RequestTrace(r.prompt_len, r.output_len) for r in workload.requests])


def _add_phases(
    trace: RunTrace, requests: list[RequestTrace], start_s: float, step_times_s: list[float]
) -> None:
    """One generate call: the prefill forward up to its first token, then one decode step per token.

    A static batch keeps stepping for padded rows; those steps count as time, their tokens do not.
    """
    trace.num_prefill_tokens += sum(r.prompt_len for r in requests)
    trace.prefill_time_s += step_times_s[0] - start_s
    trace.num_decode_tokens += sum(r.output_len - 1 for r in requests)
    trace.decode_time_s += step_times_s[-1] - step_times_s[0]
    trace.decode_step_s.extend(b - a for a, b in zip(step_times_s, step_times_s[1:], strict=False))


def _replay(trace: RunTrace, spans_s: list[tuple[float, float]]) -> float:
    """Fills the requests that were not run with copies of the measured ones, each starting when
    the previous one ends; returns the time they add."""
    num_measured = len(spans_s)
    clock_s = spans_s[-1][1]
    for index in range(num_measured, len(trace.requests)):
        source = trace.requests[index % num_measured]
        start_s, end_s = spans_s[index % num_measured]
        request = trace.requests[index]
        request.token_times_s = [clock_s + t - start_s for t in source.token_times_s]
        _add_phases(trace, [request], clock_s, request.token_times_s)
        clock_s += end_s - start_s
    trace.num_replayed = len(trace.requests) - num_measured
    return clock_s - spans_s[-1][1]


def _finish(
    trace: RunTrace, start_s: float, cpu_start: contention.CpuSnapshot, replayed_s: float = 0.0
) -> RunTrace:
    trace.wall_s = time.perf_counter() - start_s + replayed_s
    trace.others = contention.others_fraction(cpu_start, contention.snapshot())
    trace.check_complete()
    return trace
