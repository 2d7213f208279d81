"""The 1B-shaped random Llama (Llama-3.2-1B's shape, bf16; the validation script writes it and
names it in PYTGI_GPU_MODEL_1B): pytgi's teacher-forced decode logits against transformers on the
GPU, with CUDA graphs and without."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from backends.cuda.gpu import record, requires_gpu
from backends.cuda.test_gpu_parity import assert_bf16_quality, bf16_comparison

pytestmark = [
    *requires_gpu,
    pytest.mark.skipif(not os.environ.get("PYTGI_GPU_MODEL_1B"), reason="PYTGI_GPU_MODEL_1B unset"),
]


def test_bf16_1b_logits_and_top1():
    results = bf16_comparison(Path(os.environ["PYTGI_GPU_MODEL_1B"]), 32, 160, vocab=128256)
    record("bf16_1b", results)
    for stats in results.values():
        assert_bf16_quality(stats)
