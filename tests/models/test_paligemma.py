"""PaliGemma 1 and 2 through the whole engine against transformers' eager greedy generate on the
same processor outputs: the prompt layout equals PaliGemmaProcessor's; one image, two images and
text-only prompts in one batch, each prompt prefilled whole (prefix-LM attention: never chunked,
even past the step budget, which it then runs alone) while decodes mix in; no prefix hit inside a
prompt; preemption and recompute (chunked, hitting its own prompt) without the tower again."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures.images import png_bytes
from models.vlm_utils import VlmPrompts, engine_request, hf_greedy

from pytgi.runtime.llm import LLM

NEW_TOKENS = 8
LOGPROB_TOL = 1e-3  # without the prefix-LM mask the tiny models differ by ~5e-3


@pytest.fixture(scope="module")
def family_setup(tiny_vlm_factory):
    import transformers

    built = {}

    def setup(family: str):
        if family not in built:
            torch.set_num_threads(1)
            model_dir = tiny_vlm_factory(family)
            hf = transformers.PaliGemmaForConditionalGeneration.from_pretrained(
                model_dir, attn_implementation="eager"
            ).eval()
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


def record_steps(llm) -> list[tuple[str, int, int]]:
    """Every scheduled (request id, start position, tokens), step after step."""
    scheduler, seen = llm.core.scheduler, []
    schedule = scheduler.schedule

    def spy():
        output = schedule()
        seen.extend((r.request_id, r.start_pos, r.num_tokens) for r in output.requests)
        return output

    scheduler.schedule = spy
    return seen


def test_prompt_layout_equals_the_processor(family_setup):
    from PIL import Image
    from transformers import GemmaTokenizerFast, PaliGemmaProcessor, SiglipImageProcessor

    model_dir, _, prompts = family_setup("paligemma")
    processor = PaliGemmaProcessor(
        SiglipImageProcessor.from_pretrained(model_dir),
        GemmaTokenizerFast.from_pretrained(model_dir),
    )
    images = [Image.open(__import__("io").BytesIO(png_bytes(40, 30, s))) for s in (1, 2)]
    cases = [  # (pytgi's /generate text, the processor's text, images)
        ("{0}caption en", "caption en", images[:1]),
        ("{0}{1}compare them", "compare them", images),
        ("answer {0} where?", "answer <image> where?", images[:1]),
    ]
    for text, hf_text, hf_images in cases:
        ids, placed = prompts.build(text, [(40, 30, s) for s in (1, 2)][: len(hf_images)])
        out = processor(text=hf_text, images=[hf_images], return_tensors="np")
        assert ids == out["input_ids"][0].tolist()
        pixels = np.concatenate([p.features["pixel_values"] for p in placed])
        np.testing.assert_allclose(pixels, out["pixel_values"], atol=1e-6)
    ids, placed = prompts.build("no image", [])  # <bos> + text + "\n", nothing added
    assert placed == ()
    assert ids == processor.tokenizer("<bos>no image\n", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("family", ["paligemma", "paligemma2"])
def test_mixed_batch_prompts_prefilled_whole(family, family_setup):
    model_dir, hf, prompts = family_setup(family)
    batch = [
        prompts.build("{0}caption en", [(40, 30, 1)]),  # 27 tokens
        prompts.build("{0}{1} compare the two", [(40, 30, 2), (20, 50, 3)]),  # over the budget
        prompts.build("The quick brown fox jumps", []),
        prompts.build("{0}answer en what is it?", [(64, 64, 4)]),
    ]
    # 4-token blocks, a 32-token step budget: prompts wait for room, decodes mix in
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=32)
    steps = record_steps(llm)
    try:
        outs = check(llm, hf, batch)
        ids = {o.request_id: len(p[0]) for o, p in zip(outs, batch, strict=True)}
        prefills = [(rid, start, n) for rid, start, n in steps if start < ids[rid]]
        assert all(start == 0 and n == ids[rid] for rid, start, n in prefills)  # whole, once
        assert len(prefills) == len(batch)
        assert llm.core.executor.worker.runner.multimodal.cache.num_encoded == 4
    finally:
        llm.close()


def test_no_prefix_hit_inside_a_prompt_and_preemption(family_setup):
    model_dir, hf, prompts = family_setup("paligemma")
    first = prompts.build("{0}caption en", [(40, 30, 7)])
    longer = prompts.build("{0}caption en please", [(40, 30, 7)])
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=64)
    try:
        check(llm, hf, [first])
        (again,) = check(llm, hf, [first])  # the same prompt: no hit inside it (blocks < prompt)
        (other,) = check(llm, hf, [longer])  # shares its first blocks' tokens: no hit either
        assert again.num_cached_tokens == 0 and other.num_cached_tokens == 0
    finally:
        llm.close()
    crowd = [prompts.build("{0} caption en", [(40, 30, 20 + i)]) for i in range(5)]
    # 16 blocks of 4 tokens for five 36-token sequences: requests get preempted and recomputed
    llm = LLM(str(model_dir), block_size=4, num_blocks=16, max_batch_prefill_tokens=32)
    steps = record_steps(llm)
    try:
        outs = check(llm, hf, crowd)
        assert llm.core.scheduler.num_preemptions > 0
        runner = llm.core.executor.worker.runner
        assert runner.multimodal.cache.num_encoded == 5  # the recompute reused the encoder cache
        sizes = {o.request_id: len(p[0]) for o, p in zip(outs, crowd, strict=True)}
        assert all(start == 0 or start >= sizes[rid] for rid, start, _ in steps)
    finally:
        llm.close()


def test_a_backend_without_bidirectional_prompts_refuses_it(family_setup, monkeypatch):
    from pytgi.backends.cpu.attention import CpuAttentionBackend
    from pytgi.errors import ModelLoadError

    model_dir, _, _ = family_setup("paligemma")
    monkeypatch.setattr(CpuAttentionBackend, "supports_bidirectional_spans", False)
    with pytest.raises(
        ModelLoadError, match="bidirectional attention over its prompt is not implemented"
    ):
        LLM(str(model_dir), block_size=4, num_blocks=64)
