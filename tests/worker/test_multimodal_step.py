"""The worker's multimodal step: image slices of chunked steps, the encoder cache, M-RoPE rows."""

from __future__ import annotations

import numpy as np
import torch

from pytgi.messages.outputs import ScheduledRequest, SchedulerOutput
from pytgi.messages.request import MultimodalInput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.worker.multimodal import EncoderCache, MultimodalStep
from pytgi.worker.request_states import RequestState, RequestStates

HIDDEN = 4


class FakeModel:
    """Token embedding = the id; an image's embeddings = 1000 * hash number + row."""

    def __init__(self):
        self.calls = []

    def embed_input_ids(self, ids):
        return ids.float().unsqueeze(1).repeat(1, HIDDEN)

    def encode_images(self, images):
        self.calls.append([i.content_hash for i in images])
        return [
            (1000 * int(i.content_hash) + torch.arange(i.length)).float().unsqueeze(1)
            .repeat(1, HIDDEN)
            for i in images
        ]  # fmt: skip

    def mrope_positions(self, num_prompt, images):
        table = np.stack([np.arange(num_prompt)] * 3)
        table[1, images[0].offset : images[0].end] = 99
        return table, -5


def states_with(images, num_tokens=20):
    state = RequestState("r", SamplingParams(), list(range(num_tokens)), num_tokens)
    state.multimodal_inputs = images
    return RequestStates({"r": state})


def step(start, n):
    return SchedulerOutput(requests=[ScheduledRequest("r", start, n, [], [], [], True, False)])


def test_an_image_split_across_chunks_is_encoded_once():
    model = FakeModel()
    mm = MultimodalStep(model)
    image = MultimodalInput("image", 3, 10, "7")
    states = states_with((image,))
    rows = []
    for start, n in ((0, 8), (8, 8), (16, 4)):
        slices = mm.slices(step(start, n), states, {"r": 0})
        ids = torch.arange(start, start + n)
        rows.append(mm.embeddings(ids, slices)[:, 0])
    merged = torch.cat(rows)
    expected = torch.arange(20).float()
    expected[3:13] = 7000 + torch.arange(10).float()
    assert torch.equal(merged, expected)
    assert model.calls == [["7"]]


def test_encoder_cache_is_bounded_in_bytes():
    cache = EncoderCache(max_bytes=2 * 16 * 4)
    for key in "abc":
        cache.put(key, torch.zeros(16))
    assert "a" not in cache and "b" in cache and "c" in cache
    assert cache.nbytes <= cache.max_bytes


def test_mrope_rows_for_prompt_and_generated_tokens():
    mm = MultimodalStep(FakeModel())
    states = states_with((MultimodalInput("image", 2, 3, "1"),), num_tokens=6)
    positions = np.arange(4, 8)  # two prompt tokens, then two generated ones
    out = mm.mrope_positions(step(4, 4), states, {"r": 0}, positions)
    # index 4 is in the image (height row 99), 5 is text, 6 and 7 continue at index - 5
    assert out.tolist() == [[4, 5, 1, 2], [99, 5, 1, 2], [4, 5, 1, 2]]
