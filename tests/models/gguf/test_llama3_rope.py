"""Llama 3.1-3.3 GGUF files carry their llama3 rope scaling only as the `rope_freqs` tensor (the
converter's per-pair frequency factors). A tiny Llama-3.2-shaped checkpoint converted by
llama.cpp's own converter, served from the GGUF: greedy tokens and log-probabilities equal
transformers on the HF checkpoint at positions past 1,000 (where the scaled pairs have turned far
from where unscaled frequencies would put them)."""

from __future__ import annotations

import gguf
import pytest
import torch

from pytgi.models.gguf.checkpoint import GGUFCheckpoint
from pytgi.runtime.llm import LLM

NEW_TOKENS = 8


def transformers_greedy(model_dir, ids: list[int]) -> tuple[list[int], list[float]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        out = model.eval().generate(
            torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=3,
            output_scores=True, return_dict_in_generate=True,
        )  # fmt: skip
    tokens = out.sequences[0, len(ids) :].tolist()
    scores = zip(out.scores, tokens, strict=True)
    logprobs = [torch.log_softmax(s[0], -1)[t].item() for s, t in scores]
    return tokens, logprobs


def test_the_converter_writes_rope_freqs_and_pytgi_applies_them(llama32_gguf):
    path, _ = llama32_gguf
    names = [t.name for t in gguf.GGUFReader(path).tensors]
    assert "rope_freqs.weight" in names
    factors = GGUFCheckpoint(path).hf_config.rope_scaling["freq_factors"]
    assert factors[:4] == [1.0] * 4 and 1 < factors[4] < 32 and factors[5:] == [32.0] * 3


def test_greedy_tokens_and_logprobs_past_position_1000(llama32_gguf):
    path, model_dir = llama32_gguf
    torch.set_num_threads(1)
    ids = torch.randint(5, 384, (1100,), generator=torch.Generator().manual_seed(0)).tolist()
    expected, expected_logprobs = transformers_greedy(model_dir, ids)
    llm = LLM(str(path), block_size=16, num_blocks=80)
    try:
        out = llm.generate([ids], max_new_tokens=NEW_TOKENS, ignore_eos=True)[0]
    finally:
        llm.close()
    assert out.token_ids == expected
    assert out.logprobs == pytest.approx(expected_logprobs, abs=1e-3)
