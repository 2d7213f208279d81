"""Scheduler, KV cache manager and engine core without a model (a fake, history-determined
executor).
"""

from __future__ import annotations

import random

from engine.fakes import FakeExecutor, next_token

from pytgi.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pytgi.engine.engine_core import EngineCore
from pytgi.messages.request import EngineRequest, FinishReason
from pytgi.messages.sampling_params import SamplingParams, StoppingParams


def make_core(
    num_blocks=64,
    block_size=4,
    prefill=64,
    max_batch_size=None,
    caching=True,
    chunked=True,
    kv_groups=(),
):
    config = EngineConfig(
        model=ModelConfig("fake"),
        cache=CacheConfig(block_size=block_size, enable_prefix_caching=caching),
        scheduler=SchedulerConfig(
            max_batch_prefill_tokens=prefill,
            max_batch_size=max_batch_size,
            enable_chunked_prefill=chunked,
        ),
    )
    executor = FakeExecutor(num_blocks, block_size, kv_groups=kv_groups)
    return EngineCore(config, executor, executor.initialize()), executor


def request(rid, prompt, max_new=5, eos=(), prefill_logprobs=False):
    return EngineRequest(
        rid,
        list(prompt),
        SamplingParams(prefill_logprobs=prefill_logprobs),
        StoppingParams(max_new_tokens=max_new, eos_token_ids=tuple(eos)),
    )


def expected_output(prompt, max_new):
    history = list(prompt)
    for _ in range(max_new):
        history.append(next_token(history))
    return history[len(prompt) :]


def run_all(core, max_steps=10_000):
    outputs: dict[str, list[int]] = {}
    finished: dict[str, object] = {}
    for _ in range(max_steps):
        if not core.has_unfinished():
            break
        for delta in core.step():
            outputs.setdefault(delta.request_id, []).extend(t.token_id for t in delta.new_tokens)
            if delta.finished:
                finished[delta.request_id] = delta
    assert not core.has_unfinished()
    return outputs, finished


def assert_no_leak(core):
    kv = core.scheduler.kv
    for group in kv.groups:
        assert group.pool.num_free_blocks == group.pool.num_blocks
        assert all(b.ref_cnt == 0 for b in group.pool.blocks)
        assert not group.tables


def test_outputs_match_history_function():
    core, _ = make_core()
    prompts = {f"r{i}": list(range(i, i + 3 + 5 * i)) for i in range(6)}
    for rid, prompt in prompts.items():
        core.add_request(request(rid, prompt, max_new=7))
    outputs, finished = run_all(core)
    for rid, prompt in prompts.items():
        assert outputs[rid] == expected_output(prompt, 7)
        assert finished[rid].finish_reason == FinishReason.LENGTH
    assert_no_leak(core)


def test_token_budget_and_chunked_prefill():
    core, executor = make_core(prefill=8)
    core.add_request(request("long", range(1, 30), max_new=3))
    core.add_request(request("short", range(50, 53), max_new=3))
    outputs, _ = run_all(core)
    assert all(step.num_tokens <= 8 for step in executor.steps)
    # the long prompt is split over several steps
    chunks = [
        r for s in executor.steps for r in s.requests if r.request_id == "long" and not r.sample
    ]
    assert len(chunks) >= 3
    assert outputs["long"] == expected_output(range(1, 30), 3)


def test_prefill_and_decode_mix_in_one_step():
    core, executor = make_core(prefill=16)
    core.add_request(request("a", range(1, 5), max_new=10))
    core.step()
    core.add_request(request("b", range(10, 20), max_new=2))
    core.step()
    step = executor.steps[-1]
    kinds = {r.request_id: r.num_tokens for r in step.requests}
    assert kinds == {"a": 1, "b": 10}


def test_max_batch_size_limits_running():
    core, executor = make_core(max_batch_size=2)
    for i in range(5):
        core.add_request(request(f"r{i}", [i + 1] * 3, max_new=4))
    run_all(core)
    assert max(len(s.requests) for s in executor.steps) <= 2


def test_without_chunking_a_prompt_over_budget_waits():
    core, executor = make_core(prefill=8, chunked=False)
    core.add_request(request("a", range(1, 6), max_new=2))
    core.add_request(request("b", range(1, 7), max_new=2))
    core.step()
    assert [r.request_id for r in executor.steps[0].requests] == ["a"]


def test_prefix_cache_hit_skips_cached_blocks():
    core, executor = make_core(block_size=4)
    shared = list(range(100, 112))  # three full blocks
    core.add_request(request("a", shared + [1, 2], max_new=2))
    run_all(core)
    core.add_request(request("b", shared + [3], max_new=2))
    outputs, finished = run_all(core)
    first_b = next(r for s in executor.steps for r in s.requests if r.request_id == "b")
    assert first_b.start_pos == 12
    assert finished["b"].num_cached_tokens == 12
    assert outputs["b"] == expected_output(shared + [3], 2)
    assert_no_leak(core)


def test_full_prompt_hit_still_computes_last_token():
    core, executor = make_core(block_size=4)
    prompt = list(range(1, 9))
    core.add_request(request("a", prompt, max_new=1))
    run_all(core)
    core.add_request(request("b", prompt, max_new=3))
    outputs, _ = run_all(core)
    first_b = next(r for s in executor.steps for r in s.requests if r.request_id == "b")
    assert first_b.start_pos == 4 and first_b.num_tokens == 4
    assert outputs["b"] == expected_output(prompt, 3)


def test_lru_eviction_keeps_recent_prefixes():
    core, _ = make_core(num_blocks=8, block_size=4)
    kv = core.scheduler.kv
    for i in range(4):  # 3 full blocks each, 8 blocks in all: r0's are evicted first
        core.add_request(request(f"r{i}", [i + 1] * 12, max_new=1))
        run_all(core)
    core.add_request(request("again3", [4] * 12 + [9], max_new=1))
    _, finished = run_all(core)
    assert finished["again3"].num_cached_tokens == 12
    core.add_request(request("again0", [1] * 12 + [9], max_new=1))
    _, finished = run_all(core)
    assert finished["again0"].num_cached_tokens == 0
    assert kv.num_free_blocks == 8


def test_preemption_recomputes_and_loses_nothing():
    core, _ = make_core(num_blocks=10, block_size=4, prefill=64)
    prompts = {f"r{i}": [i + 1] * 6 for i in range(4)}
    for rid, prompt in prompts.items():
        core.add_request(request(rid, prompt, max_new=10))
    outputs, finished = run_all(core)
    assert core.scheduler.num_preemptions > 0
    for rid, prompt in prompts.items():
        assert outputs[rid] == expected_output(prompt, 10)
    assert_no_leak(core)


def test_prompt_logprobs_survive_chunking_and_preemption():
    core, _ = make_core(num_blocks=10, block_size=4, prefill=5)
    core.add_request(request("lp", range(1, 13), max_new=8, prefill_logprobs=True))
    core.add_request(request("other", [7] * 10, max_new=12))
    deltas = []
    while core.has_unfinished():
        deltas += [d for d in core.step() if d.request_id == "lp"]
    logprobs = [d.prefill_logprobs for d in deltas if d.prefill_logprobs is not None]
    assert logprobs == [[float(i) for i in range(12)]]


def test_eos_stops_unless_max_new_tokens_first():
    prompt = [5, 6, 7]
    first = expected_output(prompt, 1)[0]
    core, _ = make_core()
    core.add_request(request("eos", prompt, max_new=5, eos=[first]))
    core.add_request(request("len", prompt, max_new=1, eos=[first]))
    _, finished = run_all(core)
    assert finished["eos"].finish_reason == FinishReason.EOS_TOKEN
    assert finished["len"].finish_reason == FinishReason.LENGTH


def test_abort_waiting_and_running_frees_blocks():
    core, executor = make_core(max_batch_size=1)
    core.add_request(request("run", range(1, 10), max_new=50))
    core.add_request(request("queued", range(1, 10), max_new=50))
    core.step()
    core.abort("queued")
    core.abort("run")
    assert not core.has_unfinished()
    assert_no_leak(core)
    core.step()
    assert all(r.request_id != "queued" for s in executor.steps for r in s.requests)


def test_random_operations_never_leak_blocks():
    rng = random.Random(0)
    core, _ = make_core(num_blocks=24, block_size=4, prefill=16, max_batch_size=6)
    live: set[str] = set()
    for op in range(1000):
        choice = rng.random()
        if choice < 0.35:
            rid = f"r{op}"
            prompt = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 20))]
            core.add_request(request(rid, prompt, max_new=rng.randrange(1, 12), eos=[3]))
            live.add(rid)
        elif choice < 0.5 and live:
            rid = rng.choice(sorted(live))
            core.abort(rid)
            live.discard(rid)
        else:
            for delta in core.step():
                if delta.finished:
                    live.discard(delta.request_id)
    for rid in list(live):
        core.abort(rid)
    assert not core.has_unfinished()
    assert_no_leak(core)


def test_kv_groups_window_reads_hits_and_preemption():
    """A full group of 40 blocks and a window-8 group of 10 (Gemma's layout, the window group
    the scarcer): requests with shared prefixes, chunked prompts and more than the groups hold
    at once. Every step's first query finds its window's tokens in the window group's own blocks
    (the fake checks each group's cache), outputs are the history function's, requests are
    preempted when either group runs out, and nothing leaks."""
    core, executor = make_core(
        num_blocks=40, block_size=4, prefill=16, kv_groups=((None, 40), (8, 10))
    )
    kv = core.scheduler.kv
    shared = list(range(1, 21))
    prompts = {f"r{i}": shared + [100 + i] * (3 + 4 * i) for i in range(5)}
    prompts["short"] = [7, 8, 9]
    for rid, prompt in prompts.items():
        core.add_request(request(rid, prompt, max_new=12))
    outputs, finished = {}, {}
    window_held = []
    while core.has_unfinished():
        for delta in core.step():
            outputs.setdefault(delta.request_id, []).extend(t.token_id for t in delta.new_tokens)
        window_held.append(max((kv.num_held_blocks(r, 1) for r in kv.groups[1].tables), default=0))
    for rid, prompt in prompts.items():
        assert outputs[rid] == expected_output(prompt, 12)
    assert core.scheduler.num_preemptions > 0
    assert max(window_held) <= -(-8 // 4) + 1
    again = request("again", shared + [100] * 3, max_new=4)  # r0's prompt: a hit, or none
    core.add_request(again)
    _, finished = run_all(core)
    assert finished["again"].num_cached_tokens in (0, 20)
    assert_no_leak(core)
