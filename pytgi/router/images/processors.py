"""Each vision-language family's image processing, as its own transformers processor does it:
the image processor from the checkpoint's `preprocessor_config.json` (transformers' PIL/numpy
implementation: the torchvision-based fast processors and the video processors do not load
beside this CPU torch), and the placeholder text one image becomes in the prompt, with the
number of tokens the processor would expand it to.

A family is a `FamilyProcessor` registered by the config's `model_type`; `load_processor`
returns None for a model type with none (a text model: markdown images stay text, as in TGI).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pytgi.errors import ModelLoadError


@dataclass(frozen=True)
class ProcessorOutput:
    """One image, processed: its placeholder text, and per run of placeholder tokens in that
    text (the whole image, or one tile of an image split into tiles) the run's length and the
    arrays its embeddings are computed from."""

    runs: list[dict[str, np.ndarray]]  # the image processor's outputs for each run
    run_lengths: list[int]  # placeholder tokens of each run
    prompt_text: str  # what the image's markdown becomes in the prompt

    @property
    def num_tokens(self) -> int:
        return sum(self.run_lengths)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for run in self.runs for a in run.values())


class FamilyProcessor:
    """One family's processing. Subclasses set `image_token` (the placeholder whose runs the
    model's embeddings replace) and implement `_process`; a family whose processor lays out the
    whole prompt (PaliGemma: images, <bos>, text, newline) sets `lays_out_prompt` and overrides
    `layout`."""

    image_token: ClassVar[str]
    # the prompt, images or not, goes through `layout`, and is tokenized with the tokenizer's
    # special tokens only when this is None (the layout holds them)
    lays_out_prompt: ClassVar[bool] = False
    add_special_tokens: ClassVar[bool | None] = None
    # every token's states depend on the request's images (MultimodalInput.keys_whole_request)
    keys_whole_request: ClassVar[bool] = False

    def __init__(self, image_processor: Any, hf_config: Any, token_to_id):
        self.image_processor = image_processor
        self.hf_config = hf_config
        placeholder = token_to_id(self.image_token)
        if placeholder is None:
            raise ModelLoadError(f"the tokenizer has no image token {self.image_token!r}")
        self.placeholder_id: int = placeholder

    def process(self, image) -> ProcessorOutput:
        raise NotImplementedError

    def layout(self, text: str) -> str:
        """The prompt around `text` (its images already replaced by their placeholder text)."""
        return text

    @classmethod
    def load_image_processor(cls, model_dir: str | Path) -> Any:
        from transformers import AutoImageProcessor

        try:
            return AutoImageProcessor.from_pretrained(str(model_dir), use_fast=False)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the image processor of {model_dir}: {exc}") from exc


class Qwen2VLProcessing(FamilyProcessor):
    """Qwen2-VL and Qwen2.5-VL: dynamic resolution (resized to multiples of patch x merge size),
    one token per merge x merge patches, framed by <|vision_start|> ... <|vision_end|>."""

    image_token = "<|image_pad|>"

    def process(self, image) -> ProcessorOutput:
        # channels_last: a tiny image's channel axis is otherwise ambiguous to the processor
        out = self.image_processor(
            images=[image], return_tensors="np", input_data_format="channels_last"
        )
        grid = np.asarray(out["image_grid_thw"], dtype=np.int64)  # [1, 3]
        merge = self.image_processor.merge_size
        num_tokens = int(grid[0].prod()) // (merge * merge)
        features = {
            "pixel_values": np.ascontiguousarray(out["pixel_values"], dtype=np.float32),
            "image_grid_thw": grid,
        }
        text = "<|vision_start|>" + self.image_token * num_tokens + "<|vision_end|>"
        return ProcessorOutput([features], [num_tokens], text)


class Idefics3Processing(FamilyProcessor):
    """Idefics 3 (SmolVLM): the image is resized and split into tiles of the tower's size plus a
    global view, each tile `image_seq_len` <image> tokens after the pixel shuffle, framed by
    <fake_token_around_image>, <row_i_col_j> and <global-img> markers (the processor's own
    prompt builder). Each tile is its own run."""

    image_token = "<image>"

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        vision = hf_config.vision_config
        side = vision.image_size // vision.patch_size
        self.image_seq_len = side * side // (hf_config.scale_factor**2)

    def process(self, image) -> ProcessorOutput:
        from transformers.models.idefics3.processing_idefics3 import get_image_prompt_string

        out = self.image_processor(
            images=[[image]],
            return_tensors="np",
            input_data_format="channels_last",
            return_row_col_info=True,
        )
        tiles = np.ascontiguousarray(out["pixel_values"][0], dtype=np.float32)  # [n, 3, H, W]
        rows, cols = _first(out.get("rows", 0)), _first(out.get("cols", 0))
        text = get_image_prompt_string(
            rows, cols, self.image_seq_len, "<fake_token_around_image>", self.image_token,
            "<global-img>",
        )  # fmt: skip
        runs = [{"pixel_values": tiles[i : i + 1]} for i in range(tiles.shape[0])]
        return ProcessorOutput(runs, [self.image_seq_len] * len(runs), text)


class LlavaNextProcessing(FamilyProcessor):
    """Llava-Next: the image tiled at its best `image_grid_pinpoints` resolution plus a base
    view, one run of <image> tokens per image, as many as LlavaNextProcessor counts (the base
    view's patches, the unpadded grid's patches and one newline per grid row)."""

    image_token = "<image>"

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        from transformers import LlavaNextProcessor

        counter = LlavaNextProcessor.__new__(LlavaNextProcessor)  # its counting, no tokenizer
        counter.image_processor = image_processor
        counter.patch_size = hf_config.vision_config.patch_size
        counter.vision_feature_select_strategy = hf_config.vision_feature_select_strategy
        counter.num_additional_image_tokens = 1  # CLIP's CLS, dropped again by "default"
        self.counter = counter

    def process(self, image) -> ProcessorOutput:
        out = self.image_processor(
            images=[image], return_tensors="np", input_data_format="channels_last"
        )
        tiles = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)  # [1, P, C, S, S]
        sizes = np.asarray(out["image_sizes"], dtype=np.int64)  # [1, 2]: (height, width)
        height, width = tiles.shape[-2:]
        num_tokens = self.counter._get_number_of_features(
            int(sizes[0, 0]), int(sizes[0, 1]), height, width
        )
        if self.counter.vision_feature_select_strategy == "default":
            num_tokens -= 1
        features = {"pixel_values": tiles, "image_sizes": sizes}
        return ProcessorOutput([features], [num_tokens], self.image_token * num_tokens)


class PaliGemmaProcessing(FamilyProcessor):
    """PaliGemma 1 and 2: every image resized to the tower's one size and `image_seq_length`
    <image> tokens; the prompt is laid out as PaliGemmaProcessor does with <image> tokens in the
    text: <bos> right after the last image token (first when there is none), a newline at the
    end, and no special tokens added by the tokenizer (the processor turns <bos> off). With the
    images before the text that is its `<image> * N + <bos> + prompt + "\n"`."""

    image_token = "<image>"
    bos_token = "<bos>"
    lays_out_prompt = True
    add_special_tokens = False

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        if token_to_id(self.bos_token) is None:
            raise ModelLoadError(f"the tokenizer has no {self.bos_token!r} token")
        self.image_seq_len = int(
            getattr(image_processor, "image_seq_length", None)
            or hf_config.text_config.num_image_tokens
        )

    def process(self, image) -> ProcessorOutput:
        out = self.image_processor(
            images=[image], return_tensors="np", input_data_format="channels_last"
        )
        pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)  # [1, 3, S, S]
        n = self.image_seq_len
        return ProcessorOutput([{"pixel_values": pixels}], [n], self.image_token * n)

    def layout(self, text: str) -> str:
        last = text.rfind(self.image_token)
        at = last + len(self.image_token) if last != -1 else 0
        return text[:at] + self.bos_token + text[at:] + "\n"


class Gemma3Processing(FamilyProcessor):
    """Gemma 3: every image resized to the tower's one size and `mm_tokens_per_image`
    <image_soft_token> tokens, laid out as Gemma3Processor expands its <start_of_image>:
    "\n\n<start_of_image>" + tokens + "<end_of_image>\n\n". Pan-and-scan crops are not made
    (the processor's default; a checkpoint that turns them on is refused)."""

    image_token = "<image_soft_token>"
    boi_token = "<start_of_image>"
    eoi_token = "<end_of_image>"

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        for token in (self.boi_token, self.eoi_token):
            if token_to_id(token) is None:
                raise ModelLoadError(f"the tokenizer has no {token!r} token")
        if getattr(image_processor, "do_pan_and_scan", False):
            raise ModelLoadError("Gemma 3 with pan-and-scan image crops is not supported")
        self.image_seq_len = int(hf_config.mm_tokens_per_image)

    def process(self, image) -> ProcessorOutput:
        out = self.image_processor(
            images=[image], return_tensors="np", input_data_format="channels_last"
        )
        pixels = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)  # [1, 3, S, S]
        n = self.image_seq_len
        text = f"\n\n{self.boi_token}{self.image_token * n}{self.eoi_token}\n\n"
        return ProcessorOutput([{"pixel_values": pixels}], [n], text)


class Idefics2Processing(FamilyProcessor):
    """Idefics 2: the image resized (shortest / longest edge) and, with `do_image_splitting`,
    split into its four quarters plus the whole image; each of those is a run of
    `resampler_n_latents` <image> tokens between <fake_token_around_image> markers, two markers
    in a row merged into one (Idefics2Processor's prompt). A run keeps its pixels and pixel mask
    (the processor pads every image of a call to the largest)."""

    image_token = "<image>"
    fake_token = "<fake_token_around_image>"

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        if token_to_id(self.fake_token) is None:
            raise ModelLoadError(f"the tokenizer has no {self.fake_token!r} token")
        self.image_seq_len = int(hf_config.perceiver_config.resampler_n_latents)

    def process(self, image) -> ProcessorOutput:
        out = self.image_processor(
            images=[[image]], return_tensors="np", input_data_format="channels_last"
        )
        pixels = np.ascontiguousarray(out["pixel_values"][0], dtype=np.float32)  # [n, 3, H, W]
        masks = out.get("pixel_attention_mask")
        masks = np.ones((pixels.shape[0], *pixels.shape[-2:]), np.int64) if masks is None else (
            np.asarray(masks[0], dtype=np.int64))  # [n, H, W]  # fmt: skip
        runs = [
            {"pixel_values": pixels[i : i + 1], "pixel_attention_mask": masks[i : i + 1]}
            for i in range(pixels.shape[0])
        ]
        one = self.fake_token + self.image_token * self.image_seq_len + self.fake_token
        return ProcessorOutput(runs, [self.image_seq_len] * len(runs), one * len(runs))

    def layout(self, text: str) -> str:
        return text.replace(self.fake_token * 2, self.fake_token)


class Llama4Processing(FamilyProcessor):
    """Llama 4: the image on a canvas of up to `max_patches` tiles plus a global tile
    (router/images/llama4.py), each tile a run of <|patch|> tokens in Llama4Processor's layout."""

    image_token = "<|patch|>"

    def __init__(self, image_processor, hf_config, token_to_id):
        super().__init__(image_processor, hf_config, token_to_id)
        vision = hf_config.vision_config
        side = vision.image_size // vision.patch_size
        self.run_length = int(side * side * vision.pixel_shuffle_ratio**2)

    @classmethod
    def load_image_processor(cls, model_dir: str | Path) -> Any:
        from pytgi.router.images.llama4 import Llama4ImageProcessor

        return Llama4ImageProcessor.from_pretrained(model_dir)

    def process(self, image) -> ProcessorOutput:
        from pytgi.router.images.llama4 import image_prompt

        tiles, (rows, cols) = self.image_processor(image)  # [n, 3, S, S]
        runs = [{"pixel_values": tiles[i : i + 1]} for i in range(tiles.shape[0])]
        text = image_prompt(rows, cols, self.run_length)
        return ProcessorOutput(runs, [self.run_length] * len(runs), text)


class MllamaProcessing(FamilyProcessor):
    """Mllama (Llama 3.2 Vision): one <|image|> token per image (the language model attends to
    the image through its cross-attention layers); the image resized to its best tiling of up
    to `max_image_tiles` tiles, padded to that many tiles (`aspect_ratio_ids` names the tiling,
    `aspect_ratio_mask` the real tiles)."""

    image_token = "<|image|>"
    keys_whole_request = True  # rows before the first image attend over all images

    def process(self, image) -> ProcessorOutput:
        out = self.image_processor(
            images=[[image]], return_tensors="np", input_data_format="channels_last"
        )
        features = {
            "pixel_values": np.ascontiguousarray(out["pixel_values"][0], dtype=np.float32),
            "aspect_ratio_ids": np.asarray(out["aspect_ratio_ids"][0], dtype=np.int64),
            "aspect_ratio_mask": np.asarray(out["aspect_ratio_mask"][0], dtype=np.int64),
        }  # [1, tiles, C, S, S], [1], [1, tiles]
        return ProcessorOutput([features], [1], self.image_token)


def _first(value) -> int:
    """rows / cols come as [[n]] for one image (0: not split)."""
    while isinstance(value, list | tuple | np.ndarray):
        value = value[0]
    return int(value)


# model_type -> its processing (read from config.json by the launcher: no torch for text models)
PROCESSORS: dict[str, type[FamilyProcessor]] = {
    "qwen2_vl": Qwen2VLProcessing,
    "qwen2_5_vl": Qwen2VLProcessing,
    "idefics2": Idefics2Processing,
    "idefics3": Idefics3Processing,
    "llava_next": LlavaNextProcessing,
    "paligemma": PaliGemmaProcessing,
    "gemma3": Gemma3Processing,
    "llama4": Llama4Processing,
    "mllama": MllamaProcessing,
}


def is_vision_model_type(model_type: str | None) -> bool:
    return model_type in PROCESSORS


def load_processor(model_dir: str | Path, hf_config: Any, token_to_id) -> FamilyProcessor | None:
    family = PROCESSORS.get(getattr(hf_config, "model_type", None))
    if family is None:
        return None
    return family(family.load_image_processor(model_dir), hf_config, token_to_id)
