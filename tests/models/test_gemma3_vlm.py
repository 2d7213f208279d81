"""Gemma 3 multimodal through the whole engine against transformers' eager greedy generate fed by
the real Gemma3Processor (its ids, pixel values and token_type_ids): the prompt layout equals the
processor's; one image, two images of different sizes and text-only prompts in one batch with an
8-token step budget, so text is chunked around images while each image runs whole (its tokens
attend to each other both ways); a prefix hit on a repeated image that never ends inside it;
preemption and recompute without the tower again."""

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
    model_dir = tiny_vlm_factory("gemma3")
    hf = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        model_dir, attn_implementation="eager"
    ).eval()
    processor = transformers.AutoProcessor.from_pretrained(model_dir, use_fast=False)
    return model_dir, hf, processor, VlmPrompts(model_dir)


def build(setup, text: str, images: list[tuple[int, int, int]]):
    """pytgi's /generate prompt for `text` ({0}, {1}... where images go; the tokenizer adds
    <bos>) -> (ids, placed images, the processor's tensors for the same prompt)."""
    from PIL import Image

    _, _, processor, prompts = setup
    ids, placed = prompts.build(text, images)
    ids = processor.tokenizer("", add_special_tokens=True)["input_ids"] + ids  # <bos>
    placed = tuple(type(p)(**{**p.__dict__, "offset": p.offset + 1}) for p in placed)
    pils = [Image.open(io.BytesIO(png_bytes(w, h, seed))) for w, h, seed in images]
    hf_text = text.format(*["<start_of_image>"] * len(images))
    out = processor(text=hf_text, images=[pils] if pils else None, return_tensors="pt")
    assert out["input_ids"][0].tolist() == ids
    kept = {k: out[k] for k in ("pixel_values", "token_type_ids") if k in out}
    return ids, placed, kept


def check(llm, hf, batch):
    """Run `batch` [(ids, images, processor tensors)] at once; each equals transformers alone."""
    outs = llm.run([engine_request(ids, images, NEW_TOKENS) for ids, images, _ in batch])
    for out, (ids, images, kept) in zip(outs, batch, strict=True):
        tokens, logprobs = hf_greedy(hf, ids, images, NEW_TOKENS, inputs=kept)
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


def test_prompt_layout_equals_the_processor(setup):
    _, _, processor, _ = setup
    ids, placed, kept = build(setup, "Look: {0} and {1}, now?", [(40, 30, 1), (20, 50, 2)])
    pixels = np.concatenate([p.features["pixel_values"] for p in placed])
    np.testing.assert_allclose(pixels, kept["pixel_values"].numpy(), atol=1e-6)
    image_rows = [i for p in placed for i in range(p.offset, p.end)]
    assert np.flatnonzero(kept["token_type_ids"][0].numpy()).tolist() == image_rows
    boi = processor.tokenizer.convert_tokens_to_ids("<start_of_image>")
    assert all(ids[p.offset - 1] == boi for p in placed)


def test_mixed_batch_text_chunked_around_whole_images(setup):
    model_dir, hf, _, _ = setup
    batch = [
        build(setup, "Hello world! {0} What is it?", [(40, 30, 1)]),
        build(setup, "{0} and {1}, then compare them", [(20, 50, 2), (64, 64, 3)]),
        build(setup, "The quick brown fox jumps over the lazy dog.", []),
        build(setup, "Numbers: 0 1 2 3 4 5 6 7 8 9 {0}", [(30, 30, 4)]),
    ]
    # 4-token blocks, an 8-token step budget: prompts are chunked, decodes mix in; the 8-token
    # sliding window of the local layers acts on every prompt
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=8)
    steps = record_steps(llm)
    try:
        outs = check(llm, hf, batch)
        assert llm.core.executor.worker.runner.multimodal.cache.num_encoded == 4
        spans = {o.request_id: [(p.offset, p.end) for p in b[1]]
                 for o, b in zip(outs, batch, strict=True)}  # fmt: skip
        for rid, start, n in steps:
            for lo, hi in spans[rid]:  # an image never cut, neither at a step's start nor end
                assert not (lo < start < hi or lo < start + n < hi)
        chunked = [rid for rid in spans if sum(1 for r, s, _ in steps if r == rid and s == 0) == 1
                   and sum(1 for r, _, n in steps if r == rid and n > 1) > 1]  # fmt: skip
        assert len(chunked) >= 3  # text was chunked around the images
    finally:
        llm.close()


def test_prefix_hit_on_a_repeated_image(setup):
    model_dir, hf, _, _ = setup
    text = "Hello world! How are you today? {0} Describe it."
    first = build(setup, text, [(40, 30, 7)])
    image = first[1][0]
    llm = LLM(str(model_dir), block_size=4, num_blocks=256, max_batch_prefill_tokens=64)
    try:
        check(llm, hf, [first])
        (hit,) = check(llm, hf, [build(setup, text, [(40, 30, 7)])])
        assert hit.num_cached_tokens >= image.end  # past the image
        (miss,) = check(llm, hf, [build(setup, text, [(40, 30, 8)])])
        assert miss.num_cached_tokens == image.offset // 4 * 4  # the text before the image
    finally:
        llm.close()


def test_preemption_recomputes_without_the_tower(setup):
    model_dir, hf, _, _ = setup
    crowd = [build(setup, "Hi {0} tell me more, {1} and", [(40, 30, 20 + i), (30, 30, 40 + i)])
             for i in range(4)]  # fmt: skip
    # 16 blocks of 4 tokens for four ~37-token sequences: requests get preempted and recomputed
    llm = LLM(str(model_dir), block_size=4, num_blocks=16, max_batch_prefill_tokens=16,
              enable_prefix_caching=False)  # fmt: skip
    try:
        check(llm, hf, crowd)
        assert llm.core.scheduler.num_preemptions > 0
        assert llm.core.executor.worker.runner.multimodal.cache.num_encoded == 8
    finally:
        llm.close()


def test_a_backend_without_bidirectional_spans_refuses_it(setup, monkeypatch):
    from pytgi.backends.cpu.attention import CpuAttentionBackend
    from pytgi.errors import ModelLoadError

    monkeypatch.setattr(CpuAttentionBackend, "supports_bidirectional_spans", False)
    with pytest.raises(ModelLoadError, match="bidirectional attention over its images is not"):
        LLM(str(setup[0]), block_size=4, num_blocks=64)
