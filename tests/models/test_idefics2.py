"""Idefics 2 through the whole engine against transformers' eager greedy generate on the same
processor outputs: the prompt and pixels equal Idefics2Processor's (image splitting: four
quarters and the whole image, each a run of latents; neighbouring markers merged); one image,
two images of different sizes and text-only prompts in one batch with a 16-token prefill budget
that splits images across steps; prefix hits keyed by image content; preemption without the
tower again."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from fixtures.images import png_bytes
from models.vlm_utils import VlmPrompts, engine_request, hf_greedy

from pytgi.runtime.llm import LLM

NEW_TOKENS = 8
LOGPROB_TOL = 1e-3


@pytest.fixture(scope="module")
def setup(tiny_vlm_factory):
    import transformers

    torch.set_num_threads(1)
    model_dir = tiny_vlm_factory("idefics2")
    hf = transformers.Idefics2ForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()
    return model_dir, hf, VlmPrompts(model_dir)


def check(llm, hf, prompts):
    outs = llm.run([engine_request(ids, images, NEW_TOKENS) for ids, images in prompts])
    for out, (ids, images) in zip(outs, prompts, strict=True):
        tokens, logprobs = hf_greedy(hf, ids, images, NEW_TOKENS)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=LOGPROB_TOL)
    return outs


def test_prompt_and_pixels_equal_the_processor(setup):
    from PIL import Image
    from transformers import AutoTokenizer, Idefics2ImageProcessor, Idefics2Processor

    model_dir, _, prompts = setup
    processor = Idefics2Processor(
        Idefics2ImageProcessor.from_pretrained(model_dir),
        AutoTokenizer.from_pretrained(model_dir),
        image_seq_len=4,
    )
    sizes = [(40, 30, 1), (20, 50, 2)]
    images = [Image.open(io.BytesIO(png_bytes(*s))) for s in sizes]
    ids, placed = prompts.build("User:{0}{1} compare<end_of_utterance>\nAssistant:", sizes)
    out = processor(
        text="User:<image><image> compare<end_of_utterance>\nAssistant:",
        images=[images],
        return_tensors="np",
    )
    assert ids == out["input_ids"][0].tolist()
    assert len(placed) == 10  # 2 images x (4 quarters + the whole)
    for run, pixels, mask in zip(
        placed, out["pixel_values"][0], out["pixel_attention_mask"][0], strict=True
    ):
        h, w = int(mask[:, 0].sum()), int(mask[0].sum())
        ours = run.features["pixel_values"][0]
        np.testing.assert_allclose(ours[:, :h, :w], pixels[:, :h, :w], atol=1e-6)


def test_mixed_batch_with_chunked_prefill(setup):
    model_dir, hf, prompts = setup
    batch = [
        prompts.build("User:{0}caption<end_of_utterance>\nAssistant:", [(40, 30, 1)]),
        prompts.build("{0}{1} compare", [(40, 30, 2), (20, 50, 3)]),
        prompts.build("The quick brown fox", []),
    ]
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=16)
    try:
        check(llm, hf, batch)
        assert llm.core.executor.worker.runner.multimodal.cache.num_encoded == 15  # runs
    finally:
        llm.close()


def test_prefix_hits_by_image_content_and_preemption(setup):
    model_dir, hf, prompts = setup
    text = "Hello world! How are you today? {0} Describe it."
    first, same = (prompts.build(text, [(40, 30, 7)]) for _ in range(2))
    other = prompts.build(text, [(40, 30, 8)])
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=64)
    try:
        check(llm, hf, [first])
        (hit,) = check(llm, hf, [same])
        assert hit.num_cached_tokens >= first[1][-1].end - 4  # past the image
        (miss,) = check(llm, hf, [other])
        assert miss.num_cached_tokens == first[1][0].offset // 4 * 4  # the text before it
    finally:
        llm.close()
    crowd = [prompts.build("Hi {0} more", [(40, 30, 20 + i)]) for i in range(4)]
    # 18 blocks of 4 tokens for four 40-token sequences: the running ones outgrow the cache
    llm = LLM(str(model_dir), block_size=4, num_blocks=18, max_batch_prefill_tokens=32,
              enable_prefix_caching=False)  # fmt: skip
    try:
        check(llm, hf, crowd)
        assert llm.core.scheduler.num_preemptions > 0
        assert llm.core.executor.worker.runner.multimodal.cache.num_encoded == 20
    finally:
        llm.close()


def test_without_image_splitting_an_image_is_one_run(setup):
    from PIL import Image
    from transformers import AutoConfig, Idefics2ImageProcessor

    from pytgi.router.images.processors import Idefics2Processing

    model_dir, _, prompts = setup
    image_processor = Idefics2ImageProcessor.from_pretrained(model_dir, do_image_splitting=False)
    processing = Idefics2Processing(
        image_processor,
        AutoConfig.from_pretrained(model_dir),
        prompts.tokenizer.backend.token_to_id,
    )
    out = processing.process(Image.open(io.BytesIO(png_bytes(40, 30, 1))))
    assert out.run_lengths == [4]
    assert (
        out.prompt_text == "<fake_token_around_image>" + "<image>" * 4 + "<fake_token_around_image>"
    )
    assert out.runs[0]["pixel_values"].shape == (1, 3, 24, 32)  # longest edge 32
