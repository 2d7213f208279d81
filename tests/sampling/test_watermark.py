"""Watermark: exactly the green list (TGI's seeded permutation) is shifted by delta."""

from __future__ import annotations

import pytest
import torch

from pytgi.sampling.metadata import SamplingMetadata
from pytgi.sampling.sampler import Sampler
from pytgi.sampling.watermark import Watermark

from .conftest import build_request

VOCAB = 101


def reference_greenlist(prev_token: int, vocab: int, gamma: float) -> set[int]:
    generator = torch.Generator().manual_seed(15485863 * prev_token)
    return set(torch.randperm(vocab, generator=generator)[: int(vocab * gamma)].tolist())


def test_greenlist_is_tgis_seeded_permutation():
    watermark = Watermark(VOCAB, gamma=0.25, delta=2.0)
    for prev in (0, 1, 42, 100):
        assert set(watermark.greenlist_ids(prev).tolist()) == reference_greenlist(prev, VOCAB, 0.25)
    assert reference_greenlist(1, VOCAB, 0.5) != reference_greenlist(2, VOCAB, 0.5)


@pytest.mark.parametrize("with_plain_row", [True, False])
def test_sampler_shifts_exactly_the_green_list(with_plain_row):
    requests = [
        build_request(prompt_ids=[4, 7], watermark=True),
        build_request(prompt_ids=[4], output_ids=[9, 13], watermark=True),
    ]
    requests += [build_request(prompt_ids=[4, 7])] if with_plain_row else []
    scores = torch.randn(len(requests), VOCAB)  # [B, V]
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    out = Sampler(VOCAB, watermark_gamma=0.5, watermark_delta=1.5).process(scores, md)
    shift = out - scores  # [B, V]
    for row, prev in ((0, 7), (1, 13)):
        shifted = set(torch.nonzero(shift[row]).flatten().tolist())
        assert shifted == reference_greenlist(prev, VOCAB, 0.5)
        torch.testing.assert_close(shift[row][list(shifted)], torch.full((len(shifted),), 1.5))
    if with_plain_row:
        assert torch.equal(out[2], scores[2])


def test_greenlist_cache_is_bounded_and_consistent():
    watermark = Watermark(VOCAB, gamma=0.5, delta=2.0, cache_size=2)
    first = watermark.greenlist_mask(5).clone()
    for prev in (6, 7, 8):
        watermark.greenlist_mask(prev)
    assert len(watermark._masks) == 2
    assert torch.equal(watermark.greenlist_mask(5), first)
