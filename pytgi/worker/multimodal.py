"""A vision-language model's share of a step, on rank 0: which images the step's tokens cover,
their embeddings (from the encoder cache, else the vision tower, every missing image of the step
in one call), merged over the placeholder rows of the step's token embeddings; and M-RoPE
positions for the families that use them.

An image's placeholders may be split across prefill chunks (the language model attends causally
over them): each chunk takes its slice of the image's embeddings. The encoder cache is keyed by
the image's content hash and bounded in bytes, so a later chunk, a preempted and recomputed
request or another request with the same image does not run the tower again (while the entry
stays in the cache; an evicted one is computed again, which gives the same embeddings).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from pytgi.messages.outputs import SchedulerOutput
from pytgi.messages.request import MultimodalInput
from pytgi.models.multimodal import MultimodalLM
from pytgi.worker.request_states import RequestState, RequestStates

DEFAULT_ENCODER_CACHE_BYTES = 512 * 2**20


class EncoderCache:
    """content hash -> an image's embeddings [length, hidden], LRU within `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_ENCODER_CACHE_BYTES):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.num_encoded = 0  # images the tower ran for (tests, logs)
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()

    def get(self, key: str) -> torch.Tensor | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: str, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if key in self._items or size > self.max_bytes:
            return
        self._items[key] = value
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.nbytes -= old.numel() * old.element_size()

    def __contains__(self, key: str) -> bool:
        return key in self._items


@dataclass
class ImageSlice:
    """Rows [src, src + n) of an image's embeddings go to the step's flat rows [dst, dst + n)."""

    image: MultimodalInput
    dst: int
    src: int
    n: int


class MultimodalStep:
    def __init__(self, model: MultimodalLM, cache: EncoderCache | None = None):
        self.model = model
        self.cache = cache or EncoderCache()
        self._mrope: dict[str, tuple[np.ndarray, int]] = {}  # request id -> (positions, delta)

    def forget(self, request_ids) -> None:
        for request_id in request_ids:
            self._mrope.pop(request_id, None)

    def slices(
        self, output: SchedulerOutput, states: RequestStates, flat_starts: dict[str, int]
    ) -> list[ImageSlice]:
        """The image rows of the step: every image overlapping a request's scheduled tokens."""
        out = []
        for scheduled in output.requests:
            state = states[scheduled.request_id]
            start = scheduled.start_pos
            end = start + scheduled.num_tokens
            for image in state.multimodal_inputs:
                lo, hi = max(start, image.offset), min(end, image.end)
                if lo < hi:
                    dst = flat_starts[scheduled.request_id] + lo - start
                    out.append(ImageSlice(image, dst, lo - image.offset, hi - lo))
        return out

    def embeddings(self, input_ids: torch.Tensor, slices: list[ImageSlice]) -> torch.Tensor:
        """The step's input embeddings [T, hidden]: tokens, with image rows replaced."""
        embeds = self.model.embed_input_ids(input_ids)  # [T, hidden]
        if not slices:
            return embeds
        self._encode_missing([s.image for s in slices])
        for s in slices:
            image_embeds = self.cache.get(s.image.content_hash)
            if image_embeds is None:  # evicted by this step's own images: encode it alone
                image_embeds = self._encode([s.image])[0]
            embeds[s.dst : s.dst + s.n] = image_embeds[s.src : s.src + s.n].to(embeds.dtype)
        return embeds

    def _encode_missing(self, images: list[MultimodalInput]) -> None:
        missing = {i.content_hash: i for i in images if i.content_hash not in self.cache}
        if missing:
            self._encode(list(missing.values()))

    def _encode(self, images: list[MultimodalInput]) -> list[torch.Tensor]:
        encoded = self.model.encode_images(images)
        self.cache.num_encoded += len(images)
        for image, value in zip(images, encoded, strict=True):
            if value.shape[0] != image.length:
                raise RuntimeError(
                    f"the vision tower gave {value.shape[0]} embeddings for an image of "
                    f"{image.length} placeholder tokens"
                )
            self.cache.put(image.content_hash, value)
        return encoded

    def mrope_positions(
        self, output: SchedulerOutput, states: RequestStates, flat_starts: dict[str, int],
        positions: np.ndarray,
    ) -> np.ndarray:  # fmt: skip
        """positions [T] (token indices) -> M-RoPE positions [3, T]: a prompt token's from its
        prompt's table, a later token's index + the prompt's delta."""
        out = np.repeat(positions[None, :], 3, axis=0)  # [3, T]
        for scheduled in output.requests:
            state = states[scheduled.request_id]
            if not state.multimodal_inputs:
                continue  # text only: the three rows equal the token index
            table, delta = self._table(state)
            first = flat_starts[scheduled.request_id]
            rows = slice(first, first + scheduled.num_tokens + len(scheduled.draft_ids))
            index = positions[rows]
            in_prompt = index < table.shape[1]
            out[:, rows] = np.where(
                in_prompt, table[:, np.minimum(index, table.shape[1] - 1)], index + delta
            )
        return out

    def _table(self, state: RequestState) -> tuple[np.ndarray, int]:
        cached = self._mrope.get(state.request_id)
        if cached is None:
            cached = self.model.mrope_positions(state.num_prompt_tokens, state.multimodal_inputs)
            self._mrope[state.request_id] = cached
        return cached
