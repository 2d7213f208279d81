"""Fixtures for the sampling tests: sample rows built from sampling parameters."""

from __future__ import annotations

import pytest
import torch

from pytgi.messages.sampling_params import SamplingParams
from pytgi.sampling.metadata import SampleRow

torch.set_num_threads(1)


def build_request(
    prompt_ids: list[int] | None = None, output_ids: list[int] | None = None, **params
) -> SampleRow:
    """A decode-step row whose next token is sampled with `SamplingParams(**params)`."""
    prompt_ids = [1, 2, 3] if prompt_ids is None else prompt_ids
    output_ids = [] if output_ids is None else output_ids
    return SampleRow(
        request_id=f"r{id(prompt_ids)}",
        sampling=SamplingParams(**params),
        history=prompt_ids + output_ids,
        drafts=[],
        output_index=len(output_ids),
    )


@pytest.fixture
def make_request():
    return build_request
