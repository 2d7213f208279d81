"""Mixture-of-experts (and latent-attention) families against transformers' eager forward, through
the ModelRunner: the same steps as test_parity.py (mixed prompts, chunked prefill mixed with
decodes, prefix-cache hits, 32 greedy decode steps) on tiny random checkpoints with several
experts, top-k >= 2, shared experts and dense layers."""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import MOE_ARCHS
from models.runner_utils import load_hf, make_runner
from models.test_parity import (  # noqa: F401 (collected here with this module's `pair`)
    test_chunked_prefill_mixed_with_decode,
    test_greedy_decode_matches_generate,
    test_mixed_prompts_in_one_step,
    test_prefix_cache_hit,
)


@pytest.fixture(scope="module", params=list(MOE_ARCHS))
def pair(request, tiny_model_factory):
    torch.set_num_threads(1)
    model_dir = tiny_model_factory(request.param)
    runner = make_runner(model_dir)
    assert runner.model.__class__.__module__.startswith("pytgi.models."), "not native"
    return request.param, runner, load_hf(model_dir)
