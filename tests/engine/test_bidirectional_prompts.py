"""Bidirectional spans in the scheduler and KV manager, without a model. PaliGemma's prefix-LM
("prompt"): a prompt runs whole in one step (past the budget only alone), never cut by a prefix
hit; a hit covering the whole prompt (a preempted request's own blocks) is taken. Gemma 3's images
("images"): text is chunked around each image, an image runs whole in one step, a prefix hit is
cut back before an image it would end inside."""

from __future__ import annotations

from dataclasses import replace

from engine.fakes import FakeExecutor
from engine.test_scheduler import expected_output, request, run_all

from pytgi.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pytgi.engine.engine_core import EngineCore
from pytgi.engine.kv_cache_manager import KVCacheManager
from pytgi.engine.request import Request
from pytgi.messages.request import MultimodalInput


def make_core(num_blocks=64, prefill=16, mode="prompt"):
    config = EngineConfig(
        model=ModelConfig("fake"),
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(max_batch_prefill_tokens=prefill),
    )
    executor = FakeExecutor(num_blocks, 4)
    info = replace(executor.initialize(), bidirectional=mode)
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
    assert len(kv.find_cached_prefix(same)) == 0  # 2 blocks would cut the 12-token prompt
    longer = Request.from_engine_request(request("c", range(1, 17)))
    assert len(kv.find_cached_prefix(longer)) == 0  # same first tokens, another prompt length
    recompute = Request.from_engine_request(request("a2", range(1, 13)))
    recompute.output_ids = [5, 6, 7, 8, 9]  # a preempted request: prompt and output again
    assert len(kv.find_cached_prefix(recompute)) == 4  # past the prompt: taken
    plain = KVCacheManager(num_blocks=32, block_size=4)
    assert plain._full_block_hashes(same)[0] != kv._full_block_hashes(same)[0]


def with_images(rid, prompt, images, max_new=4):
    """`request` with an image (offset, length, hash) at each of `images`."""
    out = request(rid, prompt, max_new=max_new)
    out.multimodal_inputs = tuple(MultimodalInput("image", o, n, h) for o, n, h in images)
    return out


def test_text_is_chunked_around_whole_images():
    core, executor = make_core(prefill=8, mode="images")
    # a 30-token prompt, images at [6, 12) and [13, 19) (no prefix hit: distinct hashes)
    core.add_request(with_images("a", range(1, 31), [(6, 6, "x"), (13, 6, "y")]))
    core.add_request(with_images("b", range(40, 50), []))  # text only, decodes alongside
    outputs, _ = run_all(core)
    assert outputs["a"] == expected_output(range(1, 31), 4)
    chunks = [(r.start_pos, r.num_tokens) for out in executor.steps for r in out.requests
              if r.request_id == "a" and r.start_pos < 30]  # fmt: skip
    assert chunks[0] == (0, 6)  # stops before the first image
    for start, n in chunks:
        for lo, hi in [(6, 12), (13, 19)]:
            assert not start < lo < start + n < hi and not lo < start < hi  # never cut
    assert sum(n for _, n in chunks) == 30


def test_an_image_longer_than_the_budget_runs_alone():
    core, executor = make_core(prefill=8, mode="images")
    core.add_request(with_images("a", range(1, 21), [(2, 12, "x")]))  # a 12-token image
    core.add_request(with_images("b", range(40, 46), []))
    outputs, _ = run_all(core)
    assert outputs["a"] == expected_output(range(1, 21), 4)
    (step,) = [out for out in executor.steps
               if any(r.request_id == "a" and r.start_pos == 2 for r in out.requests)]  # fmt: skip
    assert [(r.request_id, r.num_tokens) for r in step.requests] == [("a", 12)]


def test_a_hit_never_ends_inside_an_image():
    kv = KVCacheManager(num_blocks=32, block_size=4, bidirectional="images")
    first = Request.from_engine_request(with_images("a", range(1, 17), [(9, 6, "x")]))
    assert kv.allocate_slots(first, 16)
    first.num_computed_tokens = 16
    kv.cache_computed_blocks(first)
    again = Request.from_engine_request(with_images("b", range(1, 17), [(9, 6, "x")]))
    assert len(kv.find_cached_prefix(again)) == 2  # 3 blocks would end at 12, inside [9, 15)
    other = Request.from_engine_request(with_images("c", range(1, 17), [(9, 6, "z")]))
    assert len(kv.find_cached_prefix(other)) == 2  # another image: the blocks before it
