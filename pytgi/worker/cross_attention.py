"""A cross-attention vision-language model's share of a step (Mllama), on rank 0: for every
request with images among the step's rows, its cross-attention keys and values and each row's
mask over them (`models/mllama.CrossAttentionBatch`).

The images' states (the tower's projected output) sit in the encoder cache, keyed by content
hash, so an image is encoded once whatever request, chunk or recompute needs it. The keys and
values are held per request (`CrossAttentionStore`): computed from its images' states the first
time a step runs one of its rows, whatever the prefix cache skipped (a prefix hit restores the
self-attention cache only), and dropped when the request is freed on the workers (finished,
aborted, preempted; the engine sends the freed ids at once when it goes idle). The store is
bounded in bytes: past the bound the least recently used requests not in the step are dropped
and recomputed from the encoder cache when they run again, which gives the same keys and
values. Why held per request and not paged: the keys and values
are fixed for the whole request (no token adds to them), every row of the request reads all of
them, and they are freed with the request, so there is nothing for blocks to share or to free
piecemeal; their size is tiles x tokens per tile per image, known when the request arrives.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from pytgi.messages.outputs import SchedulerOutput
from pytgi.messages.request import MultimodalInput
from pytgi.models.mllama import (
    CrossAttentionBatch,
    CrossAttentionRows,
    CrossAttentionState,
    image_spans,
)
from pytgi.worker.multimodal import EncoderCache
from pytgi.worker.request_states import RequestState, RequestStates

DEFAULT_CROSS_KV_BYTES = 1024 * 2**20


@dataclass
class HeldState:
    state: CrossAttentionState
    images: tuple[MultimodalInput, ...]  # by offset
    real: list[tuple[int, int]]  # per image, its real tiles' tokens [start, end) in the keys


class CrossAttentionStore:
    """request id -> its cross-attention state, LRU within `max_bytes` (the step's own requests
    are never dropped for each other)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.num_computed = 0  # states computed (tests)
        self._items: OrderedDict[str, HeldState] = OrderedDict()

    def get(self, request_id: str) -> HeldState | None:
        item = self._items.get(request_id)
        if item is not None:
            self._items.move_to_end(request_id)
        return item

    def put(self, request_id: str, item: HeldState, keep: set[str]) -> None:
        self._items[request_id] = item
        self.nbytes += item.state.nbytes
        self.num_computed += 1
        for old in list(self._items):
            if self.nbytes <= self.max_bytes:
                break
            if old not in keep:
                self.pop(old)

    def pop(self, request_id: str) -> None:
        item = self._items.pop(request_id, None)
        if item is not None:
            self.nbytes -= item.state.nbytes

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._items

    def __len__(self) -> int:
        return len(self._items)


class CrossAttentionStep:
    def __init__(self, model, max_bytes: int = DEFAULT_CROSS_KV_BYTES):
        self.model = model
        self.cache = EncoderCache()  # content hash -> image states [tiles x tokens, hidden]
        self.store = CrossAttentionStore(max_bytes)

    def forget(self, request_ids) -> None:
        for request_id in request_ids:
            self.store.pop(request_id)

    def batch(
        self, output: SchedulerOutput, states: RequestStates, flat_starts: dict[str, int]
    ) -> CrossAttentionBatch | None:
        """The step's rows of requests with images; None when the step has none (the
        cross-attention layers are skipped)."""
        with_images = [s for s in output.requests if states[s.request_id].multimodal_inputs]
        keep = {s.request_id for s in with_images}
        rows = []
        for scheduled in with_images:
            held = self._held(states[scheduled.request_id], keep)
            start = scheduled.start_pos
            positions = np.arange(start, start + scheduled.num_tokens + len(scheduled.draft_ids))
            bias, mlp_rows = self._mask(held, positions)
            rows.append(
                CrossAttentionRows(flat_starts[scheduled.request_id], held.state, bias, mlp_rows)
            )
        return CrossAttentionBatch(rows) if rows else None

    def _held(self, state: RequestState, keep: set[str]) -> HeldState:
        held = self.store.get(state.request_id)
        if held is not None:
            return held
        images = tuple(sorted(state.multimodal_inputs, key=lambda i: i.offset))
        image_states = self._image_states(images)
        per_tile = self.model.tokens_per_tile
        real, base = [], 0
        for image, s in zip(images, image_states, strict=True):
            num_tiles = int(np.asarray(image.features["aspect_ratio_mask"]).sum())
            real.append((base, base + num_tiles * per_tile))
            base += s.shape[0]
        kv = self.model.cross_attention_state(torch.cat(image_states))
        held = HeldState(kv, images, real)
        self.store.put(state.request_id, held, keep)
        return held

    def _image_states(self, images: tuple[MultimodalInput, ...]) -> list[torch.Tensor]:
        missing = {i.content_hash: i for i in images if i.content_hash not in self.cache}
        encoded = {}
        if missing:
            values = self.model.encode_images(list(missing.values()))
            self.cache.num_encoded += len(missing)
            encoded = dict(zip(missing, values, strict=True))
            for key, value in encoded.items():
                self.cache.put(key, value)
        # an image evicted by this call's own puts is still in `encoded`
        return [
            encoded[i.content_hash] if i.content_hash in encoded else self.cache.get(i.content_hash)
            for i in images
        ]

    def _mask(self, held: HeldState, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows at `positions` [n] -> (bias [n, N] additive, the rows that see an image) on the
        model's device: a row sees the real tiles of the images whose span holds it; a row that
        sees none attends over every token (its MLP is then zeroed), as transformers."""
        n, total = positions.shape[0], held.state.kv[0][0].shape[1]
        visible = np.zeros((n, total), dtype=bool)
        spans = image_spans([i.offset for i in held.images])
        for (first, last), (lo, hi) in zip(spans, held.real, strict=True):
            rows = (positions >= first) & (positions < last)
            visible[rows, lo:hi] = True
        sees_image = visible.any(axis=1)
        visible[~sees_image] = True
        device = held.state.kv[0][0].device
        dtype = held.state.kv[0][0].dtype
        bias = torch.zeros(n, total, dtype=dtype)
        bias.masked_fill_(torch.from_numpy(~visible), float("-inf"))
        mlp_rows = torch.from_numpy(np.flatnonzero(sees_image))
        return bias.to(device), mlp_rows.to(device)
