"""The image pipeline with a real processor (a tiny Qwen2-VL's): the prompt the model's own
transformers processor builds, each image at its placeholder tokens, images counted against
the token limits, the processed-image cache, and TGI's 422s for bad images."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fixtures.images import data_uri, image_server, png_bytes, png_route

from pytgi.config import LimitsConfig
from pytgi.errors import ValidationError
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.pipeline import ImagePipeline, ProcessedImageCache
from pytgi.router.params import GenerateParameters
from pytgi.router.validation import Validator
from pytgi.tokenizer.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def vlm_dir(tiny_vlm_factory):
    return tiny_vlm_factory("qwen2_vl")


@pytest.fixture(scope="module")
def tokenizer(vlm_dir):
    return Tokenizer.from_dir(vlm_dir)


def make_pipeline(vlm_dir, tokenizer, **config):
    return ImagePipeline.for_model(vlm_dir, tokenizer.backend.token_to_id, ImageConfig(**config))


def test_prompt_equals_the_transformers_processor(vlm_dir, tokenizer):
    """Markdown images expand to what Qwen2VLProcessor builds from the chat template's
    <|vision_start|><|image_pad|><|vision_end|>, with the same pixel values and grids."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor

    from pytgi.router.images.decode import decode_image

    images = [png_bytes(90, 60, seed=1), png_bytes(40, 100, seed=2)]
    pipeline = make_pipeline(vlm_dir, tokenizer)
    text = f"Hello ![]({data_uri(images[0])}) and ![]({data_uri(images[1])}) bye"
    expanded, processed = asyncio.run(pipeline.expand(text))

    hf = Qwen2VLProcessor.__new__(Qwen2VLProcessor)  # its video processor needs torchvision
    hf.image_processor = AutoImageProcessor.from_pretrained(vlm_dir, use_fast=False)
    hf.tokenizer = AutoTokenizer.from_pretrained(vlm_dir)
    hf.image_token, hf.video_token = "<|image_pad|>", "<|video_pad|>"
    hf.image_token_id = hf.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    hf.video_token_id = hf.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    marker = "<|vision_start|><|image_pad|><|vision_end|>"
    pil = [decode_image(b, ImageConfig()) for b in images]
    ref = hf(text=[f"Hello {marker} and {marker} bye"], images=pil, return_tensors="np")

    ids = tokenizer.encode(expanded, add_special_tokens=False).ids
    assert ids == ref["input_ids"][0].tolist()
    placed = pipeline.place(ids, processed)
    pixels = np.concatenate([p.features["pixel_values"] for p in placed])
    np.testing.assert_allclose(pixels, ref["pixel_values"], rtol=1e-6)
    grids = np.concatenate([p.features["image_grid_thw"] for p in placed])
    assert grids.tolist() == ref["image_grid_thw"].tolist()
    for image in placed:
        assert set(ids[image.offset : image.end]) == {pipeline.placeholder_id}
        assert image.length == int(np.prod(image.features["image_grid_thw"])) // 4
    assert placed[0].content_hash != placed[1].content_hash


def test_idefics3_prompt_equals_the_transformers_processor(tiny_vlm_factory):
    """Idefics 3 splits each image into tiles + a global view: the same prompt and tiles as
    Idefics3Processor, one run (MultimodalInput) per tile."""
    from transformers import AutoImageProcessor, AutoTokenizer, Idefics3Processor

    from pytgi.router.images.decode import decode_image

    model_dir = tiny_vlm_factory("idefics3")
    tokenizer = Tokenizer.from_dir(model_dir)
    pipeline = make_pipeline(model_dir, tokenizer)
    images = [png_bytes(112, 80, seed=1), png_bytes(50, 30, seed=2)]
    text = f"Hi ![]({data_uri(images[0])}) and ![]({data_uri(images[1])}) x"
    expanded, processed = asyncio.run(pipeline.expand(text))
    hf = Idefics3Processor(
        AutoImageProcessor.from_pretrained(model_dir, use_fast=False),
        AutoTokenizer.from_pretrained(model_dir),
        image_seq_len=4,
    )
    pil = [[decode_image(b, ImageConfig()) for b in images]]
    ref = hf(text=["Hi <image> and <image> x"], images=pil, return_tensors="np")
    ids = tokenizer.encode(expanded, add_special_tokens=False).ids
    assert ids == ref["input_ids"][0].tolist()
    placed = pipeline.place(ids, processed)
    assert len(placed) == 10 and all(p.length == 4 for p in placed)  # 2 x (2 x 2 tiles + global)
    tiles = np.concatenate([p.features["pixel_values"] for p in placed])
    np.testing.assert_array_equal(tiles, ref["pixel_values"][0])
    assert len({p.content_hash for p in placed}) == 10


def test_llava_next_prompt_equals_the_transformers_processor(tiny_vlm_factory):
    """Llava-Next: one run per image of the length LlavaNextProcessor expands <image> to, the same
    tiles; two images with nothing between them (one run of tokens) are still told apart."""
    from transformers import AutoImageProcessor, AutoTokenizer, LlavaNextProcessor

    from pytgi.router.images.decode import decode_image

    model_dir = tiny_vlm_factory("llava_next")
    tokenizer = Tokenizer.from_dir(model_dir)
    pipeline = make_pipeline(model_dir, tokenizer)
    images = [png_bytes(90, 40, seed=1), png_bytes(30, 70, seed=2)]
    text = f"Hi ![]({data_uri(images[0])})![]({data_uri(images[1])}) x"
    expanded, processed = asyncio.run(pipeline.expand(text))
    hf = LlavaNextProcessor(
        AutoImageProcessor.from_pretrained(model_dir, use_fast=False),
        AutoTokenizer.from_pretrained(model_dir),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    pil = [decode_image(b, ImageConfig()) for b in images]
    ref = hf(text=["Hi <image><image> x"], images=pil, return_tensors="np")
    ids = tokenizer.encode(expanded, add_special_tokens=False).ids
    assert ids == ref["input_ids"][0].tolist()
    placed = pipeline.place(ids, processed)
    assert [p.offset for p in placed] == [placed[0].offset, placed[0].end]  # adjacent runs
    for image, tiles in zip(placed, ref["pixel_values"], strict=True):
        n = image.features["pixel_values"].shape[1]
        np.testing.assert_array_equal(image.features["pixel_values"][0], tiles[:n])


def test_cache_processes_an_image_once_and_is_bounded(vlm_dir, tokenizer):
    pipeline = make_pipeline(vlm_dir, tokenizer)
    uri = data_uri(png_bytes(64, 64, seed=3))
    calls = []
    process = pipeline.processor.process
    pipeline.processor.process = lambda image: calls.append(1) or process(image)
    for _ in range(3):
        asyncio.run(pipeline.expand(f"![]({uri})"))
    assert len(calls) == 1
    (item,) = list(pipeline.cache._items.values())
    small = ProcessedImageCache(max_bytes=item.nbytes * 2)
    for i in range(4):
        small.put(type(item)(f"key{i}", item.output))
    assert len(small) == 2 and small.nbytes <= small.max_bytes
    assert small.get("key0") is None and small.get("key3") is not None


def validator(vlm_dir, tokenizer, max_input_tokens=40, **image_config):
    limits = LimitsConfig(max_input_tokens=max_input_tokens, max_total_tokens=64)
    from pytgi.config import CacheInfo

    cache = CacheInfo(64, 16, 64, 40, 1024, 1024, "float32", "cpu")
    pipeline = make_pipeline(vlm_dir, tokenizer, **image_config)
    return Validator(tokenizer, limits, cache, images=pipeline)


def validate(v, inputs, **params):
    return asyncio.run(v.validate(inputs, GenerateParameters(max_new_tokens=4, **params)))


def test_images_count_against_max_input_tokens(vlm_dir, tokenizer):
    v = validator(vlm_dir, tokenizer)
    small = validate(v, f"Hi ![]({data_uri(png_bytes(28, 28))})")
    marks = "<|vision_start|><|image_pad|><|vision_end|>"  # a 28 x 28 image is one token
    assert small.prompt_ids == tokenizer.encode(f"Hi {marks}").ids
    assert small.input_length == len(small.prompt_ids)
    (image,) = small.multimodal_inputs
    assert image.length == 1
    request = small.engine_request("r1")
    assert request.multimodal_inputs == small.multimodal_inputs
    # a 112 x 112 image is 16 tokens: three of them pass 40
    big = data_uri(png_bytes(112, 112))
    with pytest.raises(ValidationError) as err:
        validate(v, f"![]({big}) ![]({big}) ![]({big})")
    assert err.value.message.startswith("Input validation error: `inputs` must have less than 40")


def test_text_models_and_text_prompts_are_unchanged(vlm_dir, tokenizer):
    v = validator(vlm_dir, tokenizer)
    plain = validate(v, "Hello world")
    assert plain.multimodal_inputs == ()
    assert plain.prompt_ids == tokenizer.encode("Hello world").ids


@pytest.mark.parametrize(
    "inputs, message",
    [
        ("![](data:image/png;base64,###)", "base64 encoding is invalid: "),
        ("![](data:image/png;base64,aGVsbG8=)", "invalid image: "),
        ("![](file:///etc/passwd)", "invalid image content: "),
        (f"![]({data_uri(png_bytes(2, 500))})", "invalid image: "),  # aspect ratio > 200
        ("<|image_pad|> typed ![](IMAGE)", "invalid image content: the prompt's image"),
    ],
)
def test_bad_images_are_422(vlm_dir, tokenizer, inputs, message):
    v = validator(vlm_dir, tokenizer)
    inputs = inputs.replace("IMAGE", data_uri(png_bytes(28, 28)))
    with pytest.raises(ValidationError) as err:
        validate(v, inputs)
    assert err.value.message.startswith(f"Input validation error: {message}"), err.value.message


def test_urls_fetched_through_the_pipeline(vlm_dir, tokenizer):
    png = png_bytes(56, 56, seed=5)
    with image_server({"/cat.png": png_route(png)}) as base:
        url = f"![]({base}/cat.png)"
        closed = validator(vlm_dir, tokenizer)
        with pytest.raises(ValidationError, match="Could not fetch image: .*private"):
            validate(closed, url)
        opened = validator(vlm_dir, tokenizer, allow_private_urls=True)
        by_url = validate(opened, url)
    by_data = validate(opened, f"![]({data_uri(png)})")
    assert by_url.prompt_ids == by_data.prompt_ids
    assert by_url.multimodal_inputs[0].content_hash == by_data.multimodal_inputs[0].content_hash


def test_too_many_images(vlm_dir, tokenizer):
    v = validator(vlm_dir, tokenizer, max_images=2)
    uri = data_uri(png_bytes(28, 28))
    with pytest.raises(ValidationError, match="3 images exceed the maximum of 2"):
        validate(v, f"![]({uri})![]({uri})![]({uri})")
