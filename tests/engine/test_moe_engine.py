"""Mixture-of-experts and latent-attention families through the whole engine (scheduler, paged
KV with 4-token blocks, chunked prefill, prefix cache, preemption) against transformers' eager
greedy generate: the checks of test_llm_parity.py on Mixtral (grouped experts), DeepSeek-V3
(latent cache, recomputed after preemption) and Llama 4 (12-token attention chunks, which the
16-token prefill chunks and the prefix hits cross)."""

from __future__ import annotations

import pytest
from engine.test_llm_parity import check_engine_matches_transformers


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3", "llama4"])
def test_engine_matches_transformers(arch, tiny_model_factory):
    check_engine_matches_transformers(arch, tiny_model_factory)
