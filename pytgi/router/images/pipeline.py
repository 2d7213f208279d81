"""`ImagePipeline`: a prompt with `![](url)` images -> the prompt the model's own processor would
build (each image's markdown replaced by its placeholder text) and, once tokenized, the
`MultimodalInput` of each image at its run of placeholder tokens.

Fetching is async (bounded by `ImageConfig`); decoding and the image processor run in worker
threads, never on the event loop nor in the engine. Processed images are kept in a
byte-bounded LRU cache keyed by the hash of their encoded bytes, so a chat that resends an image
each turn processes it once.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from pytgi.errors import ModelLoadError
from pytgi.messages.request import MultimodalInput
from pytgi.router.errors import input_error
from pytgi.router.images.config import ImageConfig
from pytgi.router.images.decode import decode_image
from pytgi.router.images.fetch import fetch_image
from pytgi.router.images.processors import FamilyProcessor, ProcessorOutput, load_processor
from pytgi.router.images.sources import ImageChunk, TextChunk, decode_data_uri, split_markdown


@dataclass(frozen=True)
class ProcessedImage:
    content_hash: str
    output: ProcessorOutput

    @property
    def nbytes(self) -> int:
        return self.output.nbytes


class ProcessedImageCache:
    """LRU of processed images, bounded by the bytes of their features."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[str, ProcessedImage] = OrderedDict()

    def get(self, key: str) -> ProcessedImage | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, item: ProcessedImage) -> None:
        if item.nbytes > self.max_bytes or item.content_hash in self._items:
            return
        self._items[item.content_hash] = item
        self.nbytes += item.nbytes
        while self.nbytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.nbytes -= old.nbytes

    def __len__(self) -> int:
        return len(self._items)


class ImagePipeline:
    def __init__(self, processor: FamilyProcessor, config: ImageConfig | None = None):
        self.processor = processor
        self.config = config or ImageConfig()
        self.cache = ProcessedImageCache(self.config.cache_bytes)

    @classmethod
    def for_model(
        cls, model_dir: str | Path, token_to_id, config: ImageConfig | None = None
    ) -> ImagePipeline | None:
        """The pipeline of a vision-language checkpoint; None for a text model."""
        from transformers import AutoConfig

        try:
            hf_config = AutoConfig.from_pretrained(str(model_dir))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot read the config of {model_dir}: {exc}") from exc
        processor = load_processor(model_dir, hf_config, token_to_id)
        return None if processor is None else cls(processor, config)

    @property
    def placeholder_id(self) -> int:
        return self.processor.placeholder_id

    async def expand(self, text: str) -> tuple[str, list[ProcessedImage]]:
        """The prompt with each markdown image replaced by its placeholder text, and the images
        in prompt order."""
        chunks = split_markdown(text)
        urls = [c.url for c in chunks if isinstance(c, ImageChunk)]
        if len(urls) > self.config.max_images:
            raise input_error(
                f"invalid image content: {len(urls)} images exceed the maximum of "
                f"{self.config.max_images} per request"
            )
        images = await asyncio.gather(*(self._image(url) for url in urls))
        parts, it = [], iter(images)
        for chunk in chunks:
            is_text = isinstance(chunk, TextChunk)
            parts.append(chunk.text if is_text else next(it).output.prompt_text)
        return self.processor.layout("".join(parts)), list(images)

    @property
    def lays_out_prompt(self) -> bool:
        """Every prompt, with images or not, goes through `expand` (PaliGemma's layout)."""
        return self.processor.lays_out_prompt

    def add_special_tokens(self, asked: bool) -> bool:
        """Whether the expanded prompt is tokenized with the tokenizer's special tokens."""
        family = self.processor.add_special_tokens
        return asked if family is None else family

    async def _image(self, url: str) -> ProcessedImage:
        data = await self._load(url)
        key = hashlib.sha256(data).hexdigest()
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        output = await asyncio.to_thread(self._process, data)
        item = ProcessedImage(key, output)
        self.cache.put(item)
        return item

    async def _load(self, url: str) -> bytes:
        if url.startswith("data:"):
            return decode_data_uri(url, self.config)[1]
        if url.startswith(("http://", "https://")):
            return (await fetch_image(url, self.config))[1]
        raise input_error(f"invalid image content: `{url[:100]}` is neither a URL nor a data URI")

    def _process(self, data: bytes) -> ProcessorOutput:
        image = decode_image(data, self.config)
        try:
            return self.processor.process(image)
        except (ValueError, TypeError, OSError, ZeroDivisionError) as exc:
            raise input_error(f"invalid image: {exc}") from exc

    def place(self, ids: list[int], images: list[ProcessedImage]) -> tuple[MultimodalInput, ...]:
        """Each image's runs at the runs of placeholder tokens in `ids`, in order; a placeholder
        token typed into the text (or a run cut by truncation) makes the counts disagree: a 422.
        A run's content hash is its image's, with the run's index when the image has several."""
        expected = [n for image in images for n in image.output.run_lengths]
        runs = _split_runs(_runs(ids, self.placeholder_id), expected)
        if runs is None:
            raise input_error(
                "invalid image content: the prompt's image placeholder tokens do not match its "
                "images (placeholder tokens in the text, or an image cut by truncation)"
            )
        keyed = [
            (image.content_hash if len(image.output.runs) == 1 else f"{image.content_hash}#{i}",
             features)
            for image in images
            for i, features in enumerate(image.output.runs)
        ]  # fmt: skip
        return tuple(
            MultimodalInput(
                "image", start, length, key, features, self.processor.keys_whole_request
            )
            for (start, length), (key, features) in zip(runs, keyed, strict=True)
        )


def _split_runs(runs: list[tuple[int, int]], expected: list[int]) -> list[tuple[int, int]] | None:
    """The placeholder runs cut into the expected lengths, in order (two images with nothing
    between them are one run of tokens); None when they do not add up exactly."""
    out, it = [], iter(runs)
    start, left = 0, 0
    for length in expected:
        if left == 0:
            start, left = next(it, (0, 0))
        if length > left:
            return None
        out.append((start, length))
        start, left = start + length, left - length
    return out if left == 0 and next(it, None) is None else None


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
