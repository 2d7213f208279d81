"""The sampler's grammar stage: each grammar row's token mask (from the engine) bans tokens before
the warpers; rows without a grammar are untouched; greedy batches with a grammar leave the fast
path; logprobs and top-n alternatives come from the constrained distribution."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from pytgi.sampling.metadata import SamplingMetadata
from pytgi.sampling.sampler import Sampler

from .conftest import build_request

VOCAB = 300


def mask_allowing(*tokens: int) -> np.ndarray:
    """int32 [ceil(V / 32)] with only `tokens` allowed."""
    words = np.zeros((VOCAB + 31) // 32, dtype=np.uint32)
    for t in tokens:
        words[t // 32] |= np.uint32(1 << (t % 32))
    return words.view(np.int32)


def with_mask(row, *allowed: int):
    return replace(row, grammar_mask=mask_allowing(*allowed))


def logits_for(num_rows: int) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(7)) * 3


def test_grammar_rows_choose_allowed_tokens_and_free_rows_are_untouched():
    logits = logits_for(3)
    allowed = [logits[0].argsort()[:2].tolist(), None, [3, 5, 250]]  # row 0: its 2 worst tokens
    rows = [
        with_mask(build_request(top_n_tokens=5), *allowed[0]),
        build_request(top_n_tokens=1),
        with_mask(build_request(do_sample=True, seed=4, temperature=2.0), *allowed[2]),
    ]
    out = Sampler(VOCAB)(logits, rows)
    worst = logits[0, allowed[0]]
    assert out[0].token_id == allowed[0][int(worst.argmax())]  # greedy within the mask
    expected = worst.max() - torch.logsumexp(worst, 0)  # log_softmax over the allowed tokens
    assert math.isclose(out[0].logprob, expected.item(), abs_tol=1e-5)
    assert sorted(out[0].top_ids) == sorted(allowed[0])  # 5 asked, only 2 allowed: no -inf
    assert out[1].token_id == int(logits[1].argmax())
    assert out[1].logprob == torch.log_softmax(logits[1], 0).max().item()
    assert out[2].token_id in allowed[2]


def test_a_greedy_batch_with_a_grammar_leaves_the_fast_path():
    logits = logits_for(2)
    banned_best = [t for t in range(VOCAB) if t != int(logits[0].argmax())]
    rows = [with_mask(build_request(), *banned_best), with_mask(build_request(), 17)]
    out = Sampler(VOCAB)(logits, rows)
    assert out[0].token_id != int(logits[0].argmax())
    assert out[1].token_id == 17 and out[1].logprob == 0.0


def test_grammar_runs_before_the_warpers_and_after_the_penalties():
    """top-k after the mask keeps k allowed tokens (before it, it could keep only banned ones);
    the repetition penalty applies to the allowed token's raw score, as TGI's order has it."""
    logits = logits_for(1)
    order = logits[0].argsort(descending=True).tolist()
    allowed = order[5:8]  # the 6th, 7th and 8th best tokens
    row = with_mask(
        build_request(prompt_ids=[allowed[0]], repetition_penalty=50.0, top_k=2), *allowed
    )
    sampler = Sampler(VOCAB)
    scores = sampler.process(logits, SamplingMetadata.from_rows([row], VOCAB, "cpu"))
    kept = torch.isfinite(scores[0]).nonzero().flatten().tolist()
    assert sorted(kept) == sorted(allowed[1:])  # the penalised token fell out of the top 2
    assert sampler(logits, [row])[0].token_id in allowed[1:]


def test_each_draft_row_has_its_own_mask():
    logits = logits_for(1).expand(3, VOCAB)  # the same scores at each verification position
    base = build_request()
    rows = [with_mask(replace(base, drafts=[9] * j, output_index=j), 10 + j) for j in range(3)]
    assert [t.token_id for t in Sampler(VOCAB)(logits, rows)] == [10, 11, 12]
