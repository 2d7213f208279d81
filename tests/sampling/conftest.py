"""Fixtures for the sampling tests: scheduled requests built from sampling parameters."""

from __future__ import annotations

import pytest
import torch

from pytgi.engine.outputs import ScheduledRequest
from pytgi.engine.sampling_params import SamplingParams

torch.set_num_threads(1)


def build_request(
    prompt_ids: list[int] | None = None, output_ids: list[int] | None = None, **params
) -> ScheduledRequest:
    """A decode-step request whose next token is sampled with `SamplingParams(**params)`."""
    prompt_ids = [1, 2, 3] if prompt_ids is None else prompt_ids
    output_ids = [] if output_ids is None else output_ids
    last = (prompt_ids + output_ids)[-1]
    return ScheduledRequest(
        request_id=f"r{id(prompt_ids)}",
        input_ids=[last],
        start_pos=len(prompt_ids) + len(output_ids) - 1,
        block_ids=[0],
        sample=True,
        sampling=SamplingParams(**params),
        prompt_ids=prompt_ids,
        output_ids=output_ids,
    )


@pytest.fixture
def make_request():
    return build_request
