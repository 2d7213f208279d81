"""The 1B-shaped random Llama (Llama-3.2-1B's shape, bf16; the validation script writes it and
names it in PYTGI_GPU_MODEL_1B): pytgi's teacher-forced decode logits against transformers on the
GPU, with CUDA graphs and without."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backends.cuda.gpu import record, requires_gpu
from backends.cuda.test_gpu_parity import GRAPHS, assert_bf16_quality, bf16_comparison

pytestmark = [
    *requires_gpu,
    pytest.mark.skipif(not os.environ.get("PYTGI_GPU_MODEL_1B"), reason="PYTGI_GPU_MODEL_1B unset"),
]


@pytest.mark.parametrize("mode", list(GRAPHS))
def test_bf16_1b_logits_and_top1(mode):
    model_dir = Path(os.environ["PYTGI_GPU_MODEL_1B"])
    stats = bf16_comparison(model_dir, GRAPHS[mode], 32, 160, vocab=128256)
    record(f"bf16_1b_{mode}", stats)
    assert_bf16_quality(stats)
