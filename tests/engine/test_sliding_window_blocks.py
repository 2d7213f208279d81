"""Windowed models give back the blocks their window has left: the KV manager's rule (blocks
wholly below n - W + 1 once n tokens are computed; a placeholder keeps the table's positions; the
prefix cache never hands out a reallocated block), and a long request on the tiny Mistral (every
layer windowed, W = 24) holding a window's worth of blocks while its tokens stay transformers'."""

from __future__ import annotations

import pytest
import torch
from models.runner_utils import hf_greedy_logprobs, load_hf, prompt

from pytgi.engine.kv_cache_manager import NULL_BLOCK, KVCacheManager
from pytgi.messages.request import EngineRequest
from pytgi.messages.sampling_params import SamplingParams, StoppingParams
from pytgi.runtime.llm import LLM


def request(ids: list[int], rid: str = "r"):
    from pytgi.engine.request import Request

    engine_request = EngineRequest(rid, ids, SamplingParams(), StoppingParams(max_new_tokens=8))
    return Request.from_engine_request(engine_request)


def test_blocks_below_the_window_go_back_to_the_pool():
    kv = KVCacheManager(num_blocks=16, block_size=4, sliding_window=8)
    req = request(list(range(30)))
    assert kv.allocate_slots(req, 30)
    req.num_computed_tokens = 30  # the next query (position 30) sees keys 23..30
    assert kv.free_out_of_window(req) == 5  # blocks 0..4 hold positions 0..19
    assert kv.num_held_blocks("r") == 3 and kv.num_free_blocks == 13
    assert kv.block_ids("r")[:5] == [NULL_BLOCK.block_id] * 5  # positions kept
    assert kv.free_out_of_window(req) == 0  # idempotent
    kv.free(req)
    assert kv.num_free_blocks == 16


def test_full_attention_frees_nothing():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    req = request(list(range(30)))
    assert kv.allocate_slots(req, 30)
    req.num_computed_tokens = 30
    assert kv.free_out_of_window(req) == 0 and kv.num_held_blocks("r") == 8


def test_a_prefix_hit_never_reads_a_reallocated_block():
    """The first request's early blocks are freed (still cached); once the pool hands them out
    again their hashes are gone and a later identical prompt matches nothing past them."""
    kv = KVCacheManager(num_blocks=10, block_size=4, sliding_window=8)
    ids = list(range(100, 130))
    first = request(ids, "a")
    assert kv.allocate_slots(first, 30)
    first.num_computed_tokens = 30
    kv.cache_computed_blocks(first)
    kv.free_out_of_window(first)
    assert len(kv.find_cached_prefix(request(ids, "b"))) == 7  # freed but intact: still a hit
    other = request(list(range(200, 220)), "c")
    assert kv.allocate_slots(other, 20)  # takes the 2 never-used blocks, then freed ones
    assert len(kv.find_cached_prefix(request(ids, "d"))) == 0  # block 0 was handed out: no match


def test_mixed_groups_free_only_the_windowed_table():
    """A full group and a window-8 group (Gemma's layout): the same positions in both tables,
    the windowed one gives back its blocks below the window, the full one keeps all."""
    kv = KVCacheManager(num_blocks=16, block_size=4, groups=[(None, 16), (8, 6)])
    req = request(list(range(18)))
    assert kv.allocate_slots(req, 18)  # 5 blocks in each group
    assert kv.num_held_blocks("r", 0) == kv.num_held_blocks("r", 1) == 5
    req.num_computed_tokens = 18  # the next query (position 18) sees keys 11..18
    assert kv.free_out_of_window(req) == 2  # window blocks 0, 1 (positions 0..7)
    assert kv.num_held_blocks("r", 0) == 5 and kv.num_held_blocks("r", 1) == 3
    assert len(kv.block_ids("r", group=1)) == 5  # positions kept by placeholders
    assert kv.groups[1].pool.num_free_blocks == 3
    # 12 more tokens: 3 new blocks in each group; the window group has 3 free
    assert kv.allocate_slots(req, 12)
    assert not kv.allocate_slots(request(list(range(5)), "s"), 5)  # the window group is full
    assert kv.groups[0].pool.num_free_blocks == 8 and not kv.groups[0].tables.get("s")
    req.num_computed_tokens = 30
    assert kv.free_out_of_window(req) == 3  # positions 0..19: window blocks 2, 3, 4
    assert kv.num_held_blocks("r", 0) == 8 and kv.num_held_blocks("r", 1) == 3
    kv.free(req)
    assert [g.pool.num_free_blocks for g in kv.groups] == [16, 6]


def test_mixed_prefix_hit_takes_only_the_window_and_never_a_reallocated_block():
    """A hit is a run from the start in every group; its window blocks below the first uncached
    position's window are placeholders (not revived); once the window group has handed out an
    early block, nothing matches past it."""
    kv = KVCacheManager(num_blocks=20, block_size=4, groups=[(None, 20), (8, 8)])
    ids = list(range(100, 130))
    first = request(ids, "a")
    assert kv.allocate_slots(first, 30)
    first.num_computed_tokens = 30
    kv.cache_computed_blocks(first)
    kv.free_out_of_window(first)  # window blocks 0..4 freed, still cached
    kv.free(first)
    again = request(ids, "b")
    hit = kv.find_cached_prefix(again)
    assert len(hit) == 7  # 28 tokens; the 29th position reads keys 21..28: blocks 5, 6
    assert hit.blocks[1][:5] == [NULL_BLOCK] * 5 and NULL_BLOCK not in hit.blocks[1][5:]
    assert kv.allocate_slots(again, 2, hit)
    assert kv.num_held_blocks("b", 0) == 8 and kv.num_held_blocks("b", 1) == 3
    kv.free(again)
    other = request(list(range(200, 220)), "c")
    assert kv.allocate_slots(other, 20)  # 5 window blocks: hands out block 0's entry
    assert len(kv.find_cached_prefix(request(ids, "d"))) == 0
    kv.free(other)


def test_a_long_request_holds_only_its_window(tiny_model_factory):
    """A 120-token prompt in 16-token chunks and 40 new tokens on 4-token blocks: the request
    never holds more than (W + chunk) / block_size + 1 blocks, and its tokens and logprobs are
    transformers' (which attends within the window the same way)."""
    torch.set_num_threads(1)
    model_dir = tiny_model_factory("mistral")
    ids = prompt(120, 9)
    tokens, logprobs = hf_greedy_logprobs(load_hf(model_dir), ids, 32)
    llm = LLM(str(model_dir), block_size=4, num_blocks=64, max_batch_prefill_tokens=16)
    try:
        kv = llm.core.scheduler.kv
        assert kv.sliding_window == 24
        held, out_tokens, out_logprobs = [], [], []
        engine_request = llm._request(ids, None, len(tokens), True)
        llm.core.add_request(engine_request)
        while llm.core.has_unfinished():  # step by step: prompt chunks and decodes
            for delta in llm.core.step():
                out_tokens += [t.token_id for t in delta.new_tokens]
                out_logprobs += [t.logprob for t in delta.new_tokens]
            held.append(64 - kv.num_free_blocks)
        assert len(held) > 120 // 16 and max(held) <= (24 + 16) // 4 + 1, held
        assert out_tokens == tokens
        assert max(abs(a - b) for a, b in zip(out_logprobs, logprobs, strict=True)) < 2e-3
        assert kv.num_free_blocks == 64
    finally:
        llm.close()


@pytest.mark.parametrize("arch, kernels", [("gemma3", True), ("gemma2", True), ("gemma3", False)])
def test_mixed_windowed_and_full_layers_free_only_the_window(
    arch, kernels, tiny_model_factory, monkeypatch
):
    """Gemma 3 (window 24 and full layers alternating) and Gemma 2: a 64-token prompt in 16-token
    chunks and 32 new tokens (4x the window) on 4-token blocks, one running request: the window
    group's pool is sized for it (12 blocks beside the full group's 64) and after every step holds
    at most ceil(W / block) + 1 blocks, the full group every block; tokens and logprobs are
    transformers'. With the compiled kernels (and the fused decode stack) and without (the torch
    path reads the same tables)."""
    if not kernels:
        monkeypatch.setenv("PYTGI_CPU_KERNELS", "0")
    torch.set_num_threads(1)
    model_dir = tiny_model_factory(arch)
    ids = prompt(64, 11)
    tokens, logprobs = hf_greedy_logprobs(load_hf(model_dir), ids, 32)
    llm = LLM(
        str(model_dir), block_size=4, num_blocks=64, max_batch_prefill_tokens=16, max_batch_size=1
    )
    try:
        kv = llm.core.scheduler.kv
        # the window group: 1 request x (cdiv(23, 4) + 2) + cdiv(16, 4) blocks (worker/kv_groups)
        assert [(g.window, g.pool.num_blocks) for g in kv.groups] == [(None, 64), (24, 12)]
        assert llm.core.cache_info.max_batch_total_tokens == 64 * 4
        # with the kernels, decode steps run the fused stack over each layer's group's table
        accelerator = llm.core.executor.worker.runner.accelerator
        assert (accelerator is not None) == kernels
        engine_request = llm._request(ids, None, len(tokens), True)
        llm.core.add_request(engine_request)
        rid = engine_request.request_id
        window_held, full_held, out_tokens, out_logprobs = [], [], [], []
        while llm.core.has_unfinished():
            for delta in llm.core.step():
                out_tokens += [t.token_id for t in delta.new_tokens]
                out_logprobs += [t.logprob for t in delta.new_tokens]
            if rid in kv.groups[0].tables:
                request = llm.core.scheduler.requests[rid]
                window_held.append(kv.num_held_blocks(rid, 1))
                full_held.append(kv.num_held_blocks(rid, 0))
                assert full_held[-1] == -(-request.num_computed_tokens // 4)  # every block
        assert len(window_held) > 64 // 16 + 16 and max(window_held) <= -(-24 // 4) + 1
        assert max(full_held) == (64 + 31) // 4 + 1  # the last token's K/V is never computed
        assert out_tokens == tokens
        assert max(abs(a - b) for a, b in zip(out_logprobs, logprobs, strict=True)) < 2e-3
        assert [g.pool.num_free_blocks for g in kv.groups] == [64, 12]
    finally:
        llm.close()


@pytest.mark.parametrize("max_batch_size, num_cached", [(None, 64), (1, 0)])
def test_a_prefix_hit_past_the_window_on_mixed_layers(
    max_batch_size, num_cached, tiny_model_factory
):
    """Gemma 3: a 64-token prompt generated once, then again with 8 more tokens. With a roomy
    window group (64 blocks) its early window blocks are given back but still cached: the second
    request hits all 64 tokens, reviving only the window's blocks. With the window group sized
    for one request (12 blocks) those blocks were handed out again: no hit, the prompt is
    recomputed. Either way the tokens are transformers'."""
    torch.set_num_threads(1)
    model_dir = tiny_model_factory("gemma3")
    hf = load_hf(model_dir)
    first = prompt(64, 12)
    second = first + prompt(8, 13)
    refs = [hf_greedy_logprobs(hf, ids, 16) for ids in (first, second)]
    llm = LLM(
        str(model_dir), block_size=4, num_blocks=64, max_batch_prefill_tokens=16,
        max_batch_size=max_batch_size,
    )  # fmt: skip
    try:
        outs = [
            llm.generate([ids], max_new_tokens=16, ignore_eos=True)[0] for ids in (first, second)
        ]
        for out, (tokens, logprobs) in zip(outs, refs, strict=True):
            assert out.token_ids == tokens
            assert out.logprobs == pytest.approx(logprobs, abs=2e-3)
        assert outs[1].num_cached_tokens == num_cached
    finally:
        llm.close()
