"""Bidirectional prompts (PaliGemma's prefix-LM) in the scheduler and KV manager, without a
model: a prompt runs whole in one step (past the budget only alone), never cut by a prefix hit;
a hit covering the whole prompt (a preempted request's own blocks) is taken."""

from __future__ import annotations

from dataclasses import replace

from engine.fakes import FakeExecutor
from engine.test_scheduler import expected_output, request, run_all

from pytgi.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pytgi.engine.engine_core import EngineCore
from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.request import Request


def make_core(num_blocks=64, prefill=16):
    config = EngineConfig(
        model=ModelConfig("fake"),
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_batch_prefill_tokens=prefill),
    )
    executor = FakeExecutor(num_blocks, 4)
    info = replace(executor.initialize(), bidirectional="prompt")
    return EngineCore(config, executor, info), executor


def first_steps(executor) -> dict[str, tuple[int, int]]:
    """Each request's first scheduled (start, tokens)."""
    seen = {}
    for out in executor.steps:
        for r in out.requests:
            seen.setdefault(r.request_id, (r.start_pos, r.num_tokens))
    return seen


def test_prompts_run_whole_and_over_the_budget_alone():
    core, executor = make_core(prefill=16)
    prompts = {"a": range(1, 11), "b": range(20, 44), "c": range(50, 62)}  # 10, 24 (> 16), 12
    for rid, prompt in prompts.items():
        core.add_request(request(rid, prompt, max_new=4))
    outputs, _ = run_all(core)
    for rid, prompt in prompts.items():
        assert outputs[rid] == expected_output(prompt, 4)
        assert first_steps(executor)[rid] == (0, len(prompt))
    (alone,) = [
        out
        for out in executor.steps
        if any(r.request_id == "b" for r in out.requests)
        and any(r.start_pos == 0 for r in out.requests if r.request_id == "b")
    ]
    assert [r.request_id for r in alone.requests] == ["b"]  # over the budget: nothing else


def test_no_hit_inside_a_prompt_but_a_whole_prompt_hit_is_taken():
    kv = KVCacheManager(num_blocks=32, block_size=4, bidirectional="prompt")
    first = Request.from_engine_request(request("a", range(1, 13)))  # 12 tokens, 3 blocks
    assert kv.allocate_slots(first, 17)
    first.output_ids = [5, 6, 7, 8, 9]
    first.num_computed_tokens = 16
    kv.cache_computed_blocks(first)
    same = Request.from_engine_request(request("b", range(1, 13)))
    assert kv.find_cached_prefix(same) == []  # 2 blocks would cut the 12-token prompt
    longer = Request.from_engine_request(request("c", range(1, 17)))
    assert kv.find_cached_prefix(longer) == []  # same first tokens, another prompt length
    recompute = Request.from_engine_request(request("a2", range(1, 13)))
    recompute.output_ids = [5, 6, 7, 8, 9]  # a preempted request: prompt and output again
    assert len(kv.find_cached_prefix(recompute)) == 4  # past the prompt: taken
    plain = KVCacheManager(num_blocks=32, block_size=4)
    assert plain._full_block_hashes(same)[0] != kv._full_block_hashes(same)[0]
