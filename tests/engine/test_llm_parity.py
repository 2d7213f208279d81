"""Every claimed architecture through the whole engine (scheduler, paged KV, chunked prefill, prefix
cache, preemption) against transformers' eager greedy generate: identical tokens, close logprobs.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import ARCHS
from models.runner_utils import hf_greedy_logprobs, load_hf, prompt

from pytgi.messages.sampling_params import SamplingParams
from pytgi.runtime.llm import LLM

NEW_TOKENS = 32


def check(outputs, prompts, refs):
    for out, ids in zip(outputs, prompts, strict=True):
        tokens, logprobs = refs[tuple(ids)]
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=2e-3)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_engine_matches_transformers(arch, tiny_model_factory):
    """With the compiled CPU kernels (the default path)."""
    from pytgi.backends.cpu.kernels import load_cpu_kernels

    assert load_cpu_kernels() is not None
    check_engine_matches_transformers(arch, tiny_model_factory)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen3", "gemma2", "falcon_rw"])
def test_engine_matches_transformers_without_kernels(arch, tiny_model_factory, monkeypatch):
    """The pure-torch fallback (no compiler, PYTGI_CPU_KERNELS=0, other dtypes); gemma2 and
    falcon_rw for soft-capping and ALiBi in the torch attention path."""
    monkeypatch.setenv("PYTGI_CPU_KERNELS", "0")
    check_engine_matches_transformers(arch, tiny_model_factory)


def check_engine_matches_transformers(arch, tiny_model_factory):
    torch.set_num_threads(1)
    model_dir = tiny_model_factory(arch)
    hf = load_hf(model_dir)
    shared = prompt(20, 1)
    mixed = [prompt(3, 2), prompt(29, 3), shared + prompt(5, 4), prompt(12, 5)]
    hits = [shared + prompt(9, 6), shared[:16] + prompt(2, 7)]
    crowd = [prompt(8 + 3 * i, 10 + i) for i in range(6)]
    refs = {tuple(ids): hf_greedy_logprobs(hf, ids, NEW_TOKENS) for ids in mixed + hits + crowd}
    # 4-token blocks, a 16-token step budget (prompts are chunked, decodes mix with prefills) and
    # 40 blocks: the crowd of six 40-token sequences cannot fit at once, so requests get preempted
    llm = LLM(str(model_dir), block_size=4, num_blocks=40, max_batch_prefill_tokens=16)
    try:
        check(llm.generate(mixed, max_new_tokens=NEW_TOKENS, ignore_eos=True), mixed, refs)
        with_hits = llm.generate(hits, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        check(with_hits, hits, refs)
        cached = [o.num_cached_tokens for o in with_hits]
        if all(group.window is None for group in llm.core.scheduler.kv.groups):
            assert cached == [20, 16]
        else:  # windowed layers (all, or a window group beside the full one): blocks below the
            # window went back to the pool, and a hit needs its blocks from the start in every
            # group (docs/KV_CACHE.md), so it is whole or none
            assert cached[1] == 16 and cached[0] in (0, 20), cached
        check(llm.generate(crowd, max_new_tokens=NEW_TOKENS, ignore_eos=True), crowd, refs)
        assert llm.core.scheduler.num_preemptions > 0
    finally:
        llm.close()


def test_batch_invariance_greedy_and_seeded(tiny_model_factory):
    """A request's output is the same alone and inside a batch of 8 others with other parameters."""
    torch.set_num_threads(1)
    llm = LLM(str(tiny_model_factory("llama")), block_size=16, num_blocks=128)
    target = prompt(11, 42)
    others = [prompt(5 + 4 * i, 100 + i) for i in range(8)]
    other_params = [
        SamplingParams(do_sample=i % 2 == 0, temperature=0.7 + 0.1 * i, top_k=i * 3, seed=i)
        for i in range(8)
    ]
    try:
        for params in (SamplingParams(), SamplingParams(do_sample=True, top_p=0.9, seed=1234)):
            alone = llm.generate([target], params, max_new_tokens=24, ignore_eos=True)[0]
            batch = llm.generate(
                others[:4] + [target] + others[4:],
                other_params[:4] + [params] + other_params[4:],
                max_new_tokens=24,
                ignore_eos=True,
            )[4]
            assert batch.token_ids == alone.token_ids
            assert batch.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    finally:
        llm.close()
