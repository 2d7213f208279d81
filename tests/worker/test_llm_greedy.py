"""End to end through the engine (scheduler, prefix cache, chunked prefill) and this executor: the
offline LLM's greedy tokens equal transformers' generate()."""

from __future__ import annotations

import torch
from models.runner_utils import load_hf, prompt


def test_llm_greedy_matches_generate_with_chunks_and_prefix_hits(tiny_model_factory):
    from transformers import GenerationConfig

    from pytgi.runtime.llm import LLM

    torch.set_num_threads(1)
    model_dir = tiny_model_factory("mistral")  # sliding window 24: decode runs past it
    llm = LLM(str(model_dir), num_blocks=64, max_batch_prefill_tokens=24)
    hf = load_hf(model_dir)
    prompts = [prompt(40, 31), prompt(40, 31)[:32] + prompt(5, 32), prompt(7, 33)]
    try:
        first = llm.generate(prompts, max_new_tokens=30, ignore_eos=True)
        again = llm.generate(prompts, max_new_tokens=30, ignore_eos=True)
    finally:
        llm.close()
    config = GenerationConfig(do_sample=False, max_new_tokens=30, pad_token_id=3)
    for ids, out, repeat in zip(prompts, first, again, strict=True):
        expected = hf.generate(torch.tensor([ids]), generation_config=config)[0, len(ids) :]
        assert out.token_ids == expected.tolist()
        assert repeat.token_ids == expected.tolist()
    assert [o.num_cached_tokens for o in again][:2] == [32, 32]  # served from the prefix cache
