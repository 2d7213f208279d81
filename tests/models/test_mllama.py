"""Mllama (Llama 3.2 Vision) through the whole engine against transformers' eager greedy generate,
fed by the real MllamaProcessor (the fixture's tokenizer, which holds <|image|>): the prompt and
pixel values equal the processor's; one image, several images (apart and adjacent) and text-only
prompts in one batch with chunked prefill; prefix hits that still compute the cross-attention
state; preemption with a store bound that forces recomputing it; the state freed with the
request."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from models.vlm_utils import VlmPrompts, engine_request, hf_greedy, processor_inputs

from pytgi.runtime.llm import LLM

NEW_TOKENS = 10
LOGPROB_TOL = 2e-3


@pytest.fixture(scope="module")
def setup(tiny_vlm_factory):
    from transformers import (
        AutoTokenizer,
        MllamaForConditionalGeneration,
        MllamaImageProcessor,
        MllamaProcessor,
    )

    torch.set_num_threads(1)
    model_dir = tiny_vlm_factory("mllama")
    hf = MllamaForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager")
    processor = MllamaProcessor(
        MllamaImageProcessor.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    )
    return model_dir, hf.eval(), processor, VlmPrompts(model_dir)


MLLAMA_INPUTS = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")


def build(setup, text: str, images: list[tuple[int, int, int]]):
    """(ids, inputs, the processor's tensors) for `text` with `{0}`... where images go."""
    _, _, processor, prompts = setup
    ids, inputs = prompts.build(text, images)
    plain = text.format(*["<|image|>"] * len(images))
    ref_ids, ref = processor_inputs(processor, plain, images, MLLAMA_INPUTS)
    assert ref_ids == ids
    return ids, inputs, ref


def check(setup, llm, prompts):
    _, hf, _, _ = setup
    outs = llm.run([engine_request(ids, images, NEW_TOKENS) for ids, images, _ in prompts])
    for out, (ids, images, ref) in zip(outs, prompts, strict=True):
        tokens, logprobs = hf_greedy(hf, ids, images, NEW_TOKENS, inputs=ref)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=LOGPROB_TOL)
    return outs


def step_helper(llm):
    return llm.core.executor.worker.runner.multimodal


def test_prompt_and_pixels_equal_the_processor(setup):
    ids, inputs, ref = build(setup, "<s>Look {0} and {1}{2} now", [(56, 28, 1), (28, 84, 2),
                                                                    (40, 40, 3)])  # fmt: skip
    assert [i.length for i in inputs] == [1, 1, 1]
    pixels = np.concatenate([i.features["pixel_values"] for i in inputs])
    np.testing.assert_allclose(pixels, ref["pixel_values"][0].numpy(), atol=1e-6)
    ratio_ids = np.concatenate([i.features["aspect_ratio_ids"] for i in inputs])
    assert ratio_ids.tolist() == ref["aspect_ratio_ids"][0].tolist()


def test_mixed_batch_with_chunked_prefill(setup, monkeypatch):
    from pytgi.models import mllama

    monkeypatch.setattr(mllama, "ROW_CHUNK", 5)  # several score blocks per prompt chunk
    model_dir = setup[0]
    batch = [
        build(setup, "<s>Hello world! {0} What is it?", [(56, 56, 1)]),  # rows before the image
        build(
            setup,
            "<s>{0} and {1}, then {2}{3} end",
            [(56, 28, 2), (28, 84, 3), (28, 28, 4), (84, 28, 5)],
        ),  # fmt: skip
        build(setup, "<s>The quick brown fox jumps over the lazy dog.", []),
        build(setup, "<s>Numbers: 0 1 2 3 4 5 6 7 {0}", [(84, 56, 6)]),
    ]
    # 4-token blocks and a 16-token step budget: prompts span prefill chunks, decodes mix in
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=16)
    try:
        check(setup, llm, batch)
        helper = step_helper(llm)
        assert helper.cache.num_encoded == 6  # each image through the tower once
        assert helper.store.num_computed == 3  # one state per request with images
        assert len(helper.store) == 0  # freed when the requests finished
    finally:
        llm.close()


def test_prefix_hit_still_computes_the_cross_attention_state(setup):
    text = "<s>Hello world! How are you today? {0} Describe it in words."
    first = build(setup, text, [(56, 56, 7)])
    llm = LLM(str(setup[0]), block_size=4, num_blocks=256, max_batch_prefill_tokens=32)
    try:
        check(setup, llm, [first])
        (hit,) = check(setup, llm, [build(setup, text, [(56, 56, 7)])])
        assert hit.num_cached_tokens > first[1][0].end  # past the image
        helper = step_helper(llm)
        assert helper.store.num_computed == 2 and helper.cache.num_encoded == 1
        # another image: no block is shared, the text before the image included (its rows
        # attend over all the request's images)
        (miss,) = check(setup, llm, [build(setup, text, [(56, 56, 8)])])
        assert miss.num_cached_tokens == 0
    finally:
        llm.close()


def test_preemption_and_a_bounded_store_recompute_the_state(setup):
    text = "<s>Hi {0} tell me more, {1} and more"
    crowd = [build(setup, text, [(56, 28, 20 + i), (28, 28, 40 + i)]) for i in range(4)]
    # 16 blocks of 4 tokens: four ~30-token sequences cannot all fit, requests get preempted
    llm = LLM(
        str(setup[0]),
        block_size=4,
        num_blocks=16,
        max_batch_prefill_tokens=32,
        enable_prefix_caching=False,
    )
    helper = step_helper(llm)
    helper.store.max_bytes = 1  # hold only the step's own requests
    try:
        check(setup, llm, crowd)
        assert llm.core.scheduler.num_preemptions > 0
        assert helper.store.num_computed > len(crowd)  # recomputed after preemption / eviction
        assert helper.cache.num_encoded == 8  # from the encoder cache, not the tower
        assert len(helper.store) == 0
    finally:
        llm.close()


def test_text_only_skips_cross_attention_and_abort_frees_the_state(setup):
    ids, images, _ = build(setup, "<s>Abort me {0} soon", [(28, 28, 9)])
    llm = LLM(str(setup[0]), block_size=4, num_blocks=64, max_batch_prefill_tokens=32)
    try:
        check(setup, llm, [build(setup, "<s>Only words here, no pictures.", [])])
        assert step_helper(llm).store.num_computed == 0
        request = engine_request(ids, images, NEW_TOKENS)
        llm.core.add_request(request)
        llm.core.step()
        helper = step_helper(llm)
        assert len(helper.store) == 1
        llm.core.abort(request.request_id)
        assert len(helper.store) == 0
    finally:
        llm.close()


@pytest.mark.parametrize(
    "locations", [[0], [3], [3, 7], [3, 4, 9], [3, 4], [2, 3, 4, 8, 9], [1, 5, 6, 10]]
)
def test_image_spans_equal_the_processors_mask(locations):
    """Which tokens see which image, against MllamaProcessor's own sparse mask (its end of the
    sequence is open-ended here: generated tokens see what the last prompt token sees)."""
    from transformers.models.mllama.processing_mllama import get_cross_attention_token_mask

    from pytgi.models.mllama import image_spans

    length, image = 12, 99
    ids = [image if i in locations else 1 for i in range(length)]
    expected = [(a, math.inf if b in (-1, length) else b)
                for a, b in get_cross_attention_token_mask(ids, image)]  # fmt: skip
    assert image_spans(locations) == expected


def test_ngram_drafts_see_the_images_of_their_rows(setup):
    """Draft rows verify under the same image masks as the row they follow."""
    prompt = build(setup, "<s>a b c a b c {0} a b c a b c a b", [(56, 56, 12)])
    llm = LLM(str(setup[0]), block_size=4, num_blocks=64, speculate=3, speculation_policy="always")
    try:
        check(setup, llm, [prompt])
        assert llm.core.scheduler.num_draft_tokens > 0
    finally:
        llm.close()
