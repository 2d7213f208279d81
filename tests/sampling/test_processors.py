"""Each batched processor against transformers' logits processors, row by row, with mixed params."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from pytgi.sampling import processors
from pytgi.sampling.metadata import SamplingMetadata
from pytgi.sampling.processors import (
    apply_frequency_penalty,
    apply_repetition_penalty,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    apply_typical_p,
)
from pytgi.sampling.sampler import Sampler

from .conftest import build_request

VOCAB = 257


def random_scores(num_rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, vocab, generator=generator) * 3  # [B, V]


def hf_rows(processors, scores: torch.Tensor, histories=None) -> torch.Tensor:
    """Apply processors[i] (a transformers processor or None) to row i alone."""
    rows = []
    for i, proc in enumerate(processors):
        row = scores[i : i + 1].clone()  # [1, V]
        ids = torch.tensor([histories[i] if histories else [0]])  # [1, L]
        rows.append(row if proc is None else proc(ids, row))
    return torch.cat(rows)  # [B, V]


def penalised(scores: torch.Tensor, requests: list) -> torch.Tensor:
    md = SamplingMetadata.from_rows(requests, scores.shape[-1], "cpu")
    return Sampler(scores.shape[-1]).process(scores, md)


def test_repetition_penalty_matches_transformers():
    histories = [[3, 3, 9, 100], [4, 250], [1, 2, 3, 4, 5, 6], [7], [250, 3, 3]]
    penalties = [1.3, 0.7, 2.0, 1.0, 1.1]
    requests = [
        build_request(prompt_ids=h[:1], output_ids=h[1:], repetition_penalty=p)
        for h, p in zip(histories, penalties, strict=True)
    ]
    scores = random_scores(5)
    hf = [RepetitionPenaltyLogitsProcessor(penalty=p) for p in penalties]
    expected = hf_rows(hf, scores, histories)
    torch.testing.assert_close(penalised(scores, requests), expected, rtol=0, atol=0)


def test_repetition_penalty_leaves_unseen_id_zero_alone():
    scores = random_scores(2)
    requests = [
        build_request(prompt_ids=[5], repetition_penalty=2.0),
        build_request(prompt_ids=[5, 6], output_ids=[7], repetition_penalty=2.0),
    ]
    out = penalised(scores, requests)
    assert torch.equal(out[:, 0], scores[:, 0])  # TGI's padding bug would hit id 0 here
    assert not torch.equal(out[1, 7], scores[1, 7])


def test_frequency_penalty_by_hand():
    requests = [
        build_request(prompt_ids=[5, 5], output_ids=[5, 8], frequency_penalty=0.5),
        build_request(prompt_ids=[1]),
        build_request(prompt_ids=[9], output_ids=[9, 4], frequency_penalty=2.0),
    ]
    scores = random_scores(3)
    expected = scores.clone()
    expected[0, 5] -= 0.5 * 3 / 4
    expected[0, 8] -= 0.5 * 1 / 4
    expected[2, 9] -= 2.0 * 2 / 3
    expected[2, 4] -= 2.0 * 1 / 3
    torch.testing.assert_close(penalised(scores, requests), expected)


def test_penalty_processors_elementwise():
    logits = torch.tensor([-2.0, 3.0, 0.0])
    penalty = torch.tensor([2.0, 2.0, 2.0])
    assert apply_repetition_penalty(logits, penalty).tolist() == [-4.0, 1.5, 0.0]
    counts, lens = torch.tensor([1.0, 4.0, 2.0]), torch.tensor([4.0, 4.0, 8.0])
    out = apply_frequency_penalty(logits, counts, penalty, lens)
    assert out.tolist() == [-2.5, 1.0, -0.5]


def test_temperature_matches_transformers():
    temps = [0.3, 1.0, 1.7, 0.05]
    scores = random_scores(4)
    ours = apply_temperature(scores, torch.tensor(temps))
    hf = [TemperatureLogitsWarper(t) for t in temps]
    torch.testing.assert_close(ours, hf_rows(hf, scores), rtol=0, atol=0)


def test_top_k_matches_transformers_with_ties():
    top_k = [1, 3, 10, VOCAB + 5, 4]
    scores = random_scores(5)
    scores[4, :6] = 9.0  # six-way tie at the top: top-4 keeps all six
    ours = apply_top_k(scores, torch.tensor(top_k))
    hf = [TopKLogitsWarper(k) for k in top_k]
    torch.testing.assert_close(ours, hf_rows(hf, scores), rtol=0, atol=0)
    assert torch.isfinite(ours[4]).sum() == 6
    assert torch.isfinite(ours[0]).sum() == 1


@pytest.mark.parametrize("temperature", [1.0, 0.2])
def test_top_p_matches_transformers(temperature):
    top_p = [0.1, 0.5, 0.9, 0.99, 0.999]
    scores = random_scores(5, seed=1) / temperature
    ours = apply_top_p(scores, torch.tensor(top_p))
    hf = [TopPLogitsWarper(p) for p in top_p]
    torch.testing.assert_close(ours, hf_rows(hf, scores), rtol=0, atol=0)
    assert (torch.isfinite(ours).sum(-1) >= 1).all()


def test_top_p_on_candidates_and_full_sort_fallback_match_transformers(monkeypatch):
    monkeypatch.setattr(processors, "TOP_P_CANDIDATES", 16)
    scores = random_scores(6, seed=4)
    scores[:3] *= 4  # peaked: the nucleus lies within the 16 best tokens
    scores[3:] *= 0.1  # flat: the nucleus reaches further, these rows take the full sort
    top_p = [0.5, 0.9, 0.95, 0.5, 0.9, 0.3]
    top16_mass = scores.softmax(-1).topk(16).values.sum(-1)  # [6]
    assert (top16_mass[:3] > 0.95).all() and (top16_mass[3:] < 0.3).all()
    ours = apply_top_p(scores, torch.tensor(top_p))
    hf = [TopPLogitsWarper(p) for p in top_p]
    torch.testing.assert_close(ours, hf_rows(hf, scores), rtol=0, atol=0)


def test_typical_p_matches_transformers():
    mass = [0.05, 0.2, 0.5, 0.95]
    scores = random_scores(4, seed=2)
    scores[3, 10:] = -float("inf")  # an earlier filter's -inf must not break the entropy
    ours = apply_typical_p(scores, torch.tensor(mass))
    hf = [TypicalLogitsWarper(m) for m in mass]
    torch.testing.assert_close(ours, hf_rows(hf, scores), rtol=0, atol=0)


MIXED = [
    dict(),  # greedy, nothing to do
    dict(do_sample=True, seed=1, temperature=0.7, top_k=20, top_p=0.9),
    dict(repetition_penalty=1.5),
    dict(do_sample=True, seed=2, typical_p=0.5, repetition_penalty=0.8),
    dict(do_sample=True, seed=3, top_p=0.6, temperature=1.3),
    dict(do_sample=True, seed=4, top_k=5),
    dict(frequency_penalty=0.9, repetition_penalty=1.2, top_k=7, seed=5),
]


def hf_chain(params: dict, history: list[int], row: torch.Tensor) -> torch.Tensor:
    """transformers' processors in TGI's order, plus the frequency penalty by hand."""
    ids = torch.tensor([history])  # [1, L]
    if params.get("repetition_penalty", 1.0) != 1.0:
        row = RepetitionPenaltyLogitsProcessor(params["repetition_penalty"])(ids, row)
    if params.get("frequency_penalty", 0.0) != 0.0:
        counts = torch.bincount(ids[0], minlength=row.shape[-1]).float()  # [V]
        row = row - params["frequency_penalty"] * counts / len(history)
    warpers = [
        ("temperature", TemperatureLogitsWarper, 1.0),
        ("top_k", TopKLogitsWarper, 0),
        ("top_p", TopPLogitsWarper, 1.0),
        ("typical_p", TypicalLogitsWarper, 1.0),
    ]
    for name, cls, neutral in warpers:
        if params.get(name, neutral) != neutral:
            row = cls(params[name])(ids, row)
    return row


def test_sampler_process_matches_transformers_chain():
    histories = [[i % VOCAB, (3 * i) % VOCAB, 11, 11] for i in range(len(MIXED))]
    requests = [
        build_request(prompt_ids=h[:2], output_ids=h[2:], **p)
        for h, p in zip(histories, MIXED, strict=True)
    ]
    scores = random_scores(len(MIXED), seed=3)
    md = SamplingMetadata.from_rows(requests, VOCAB, "cpu")
    ours = Sampler(VOCAB).process(scores, md)
    rows = [scores[i : i + 1] for i in range(len(MIXED))]
    expected = torch.cat([hf_chain(*args) for args in zip(MIXED, histories, rows, strict=True)])
    torch.testing.assert_close(ours, expected)
    assert torch.equal(ours[0], scores[0])
