"""Vision-language families (Qwen2-VL, Qwen2.5-VL, Idefics 3, Llava-Next, Llama 4) through the whole
engine against transformers' eager greedy generate on the same processor outputs: one image,
several images of different sizes and text-only prompts in one batch, with chunked prefill
splitting images across steps (and, on Llama 4, its 12-token attention chunks); prefix hits keyed
by image content; preemption and recompute without running the vision tower again."""

from __future__ import annotations

import pytest
import torch
from models.vlm_utils import VlmPrompts, engine_request, hf_greedy

from pytgi.runtime.llm import LLM

NEW_TOKENS = 12
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def family_setup(tiny_vlm_factory):
    import transformers
    from fixtures.tiny_vlms import FAMILIES

    built = {}

    def setup(family: str):
        if family not in built:
            torch.set_num_threads(1)
            model_dir = tiny_vlm_factory(family)
            model_class = getattr(transformers, FAMILIES[family][1])
            hf = model_class.from_pretrained(model_dir, attn_implementation="eager").eval()
            built[family] = model_dir, hf, VlmPrompts(model_dir)
        return built[family]

    return setup


def check(llm, hf, prompts):
    """Run `prompts` [(ids, images)] as one batch; each equals transformers alone."""
    outs = llm.run([engine_request(ids, images, NEW_TOKENS) for ids, images in prompts])
    for out, (ids, images) in zip(outs, prompts, strict=True):
        tokens, logprobs = hf_greedy(hf, ids, images, NEW_TOKENS)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=LOGPROB_TOL)
    return outs


def runner(llm):
    return llm.core.executor.worker.runner


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "idefics3", "llava_next", "llama4"])
def test_mixed_batch_with_chunked_prefill(family, family_setup):
    check_mixed_batch(family_setup, family)


def check_mixed_batch(family_setup, family: str, **engine_options) -> None:
    """Images and text in one batch, images split across prefill chunks, against transformers;
    on an engine with `engine_options` (the GPU test: dtype float32)."""
    model_dir, hf, prompts = family_setup(family)
    batch = [
        prompts.build("Hello world! {0} What is it?", [(112, 112, 1)]),  # 16 image tokens
        prompts.build("{0} and {1}, then {2}", [(56, 84, 2), (100, 40, 3), (28, 28, 4)]),
        prompts.build("The quick brown fox jumps over the lazy dog.", []),
        prompts.build("Numbers: 0 1 2 3 {0}", [(84, 56, 5)]),
    ]
    # 4-token blocks and a 16-token step budget: images span prefill chunks, decodes mix in
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=16,
              **engine_options)  # fmt: skip
    try:
        check(llm, hf, batch)
        # each image (Idefics 3: each of its tiles) once
        assert runner(llm).multimodal.cache.num_encoded == sum(len(p[1]) for p in batch)
    finally:
        llm.close()


@pytest.mark.parametrize("family", ["qwen2_vl", "llama4"])
def test_prefix_cache_is_keyed_by_image_content(family, family_setup):
    model_dir, hf, prompts = family_setup(family)
    text = "Hello world! How are you today? {0} Describe it."
    first = prompts.build(text, [(112, 112, 7)])
    same = prompts.build(text, [(112, 112, 7)])
    other = prompts.build(text, [(112, 112, 8)])
    assert first[0] == other[0]  # the same token ids: only the image differs
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=64)
    try:
        check(llm, hf, [first])
        text_blocks = first[1][0].offset // 4 * 4  # full blocks before the image
        (hit,) = check(llm, hf, [same])
        assert hit.num_cached_tokens >= first[1][0].end - 4  # past the image
        (miss,) = check(llm, hf, [other])
        assert miss.num_cached_tokens == text_blocks  # the text before the image only
    finally:
        llm.close()


@pytest.mark.parametrize("family", ["qwen2_vl", "llama4"])
def test_preemption_recomputes_without_the_tower(family, family_setup):
    model_dir, hf, prompts = family_setup(family)
    text = "Hi {0} tell me more, {1} and more"
    crowd = [prompts.build(text, [(112, 56, 20 + i), (56, 56, 40 + i)]) for i in range(5)]
    # 30 blocks of 4 tokens: five ~40-token sequences cannot all fit, requests get preempted
    llm = LLM(
        str(model_dir),
        block_size=4,
        num_blocks=30,
        max_batch_prefill_tokens=32,
        enable_prefix_caching=False,
    )
    try:
        check(llm, hf, crowd)
        assert llm.core.scheduler.num_preemptions > 0
        # each run (an image, or one Llama 4 tile) once: recompute reused the cache
        assert runner(llm).multimodal.cache.num_encoded == sum(len(p[1]) for p in crowd)
    finally:
        llm.close()
