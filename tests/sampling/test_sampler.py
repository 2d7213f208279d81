"""Sampler: greedy fast path, logprobs of processed scores, seeded sampling invariants."""

from __future__ import annotations

import pytest
import torch

from pytgi.sampling import sampler as sampler_module
from pytgi.sampling.metadata import SamplingMetadata
from pytgi.sampling.sampler import Sampler, sample_from_probs, uniform

from .conftest import build_request

VOCAB = 300


def random_logits(num_rows: int, seed: int = 0, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randn(num_rows, vocab, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_fast_path_is_argmax_with_raw_logprobs():
    logits = random_logits(5)
    before = logits.clone()
    out = Sampler(VOCAB)(logits, [build_request() for _ in range(5)])
    assert [t.token_id for t in out] == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).max(-1).values
    torch.testing.assert_close(torch.tensor([t.logprob for t in out]), expected)
    assert all(t.top_ids == [] for t in out)
    assert torch.equal(logits, before)


def test_chosen_logprob_is_log_softmax_of_processed_scores():
    params = [
        dict(do_sample=True, seed=3, temperature=0.5, top_k=10),
        dict(repetition_penalty=2.0),
        dict(do_sample=True, seed=4, top_p=0.8, top_n_tokens=2),
        dict(),
    ]
    requests = [build_request(prompt_ids=[5, 6], **p) for p in params]
    logits = random_logits(4, seed=1)
    sampler = Sampler(VOCAB)
    out = sampler(logits, requests)
    scores = sampler.process(logits, SamplingMetadata.from_rows(requests, VOCAB, "cpu"))
    logprobs = torch.log_softmax(scores, -1)  # [B, V]
    for row, token in enumerate(out):
        assert token.logprob == pytest.approx(logprobs[row, token.token_id].item(), abs=1e-6)
        assert torch.isfinite(scores[row, token.token_id])
    assert out[1].token_id == scores[1].argmax().item()
    assert out[3].token_id == logits[3].argmax().item()
    assert out[2].top_ids == logprobs[2].topk(2).indices.tolist()


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    logits = random_logits(1, seed=2).expand(16, VOCAB)  # [16, V]: same distribution each row
    requests = [build_request(do_sample=True, seed=s, temperature=3.0) for s in range(16)]
    first = [t.token_id for t in Sampler(VOCAB)(logits, requests)]
    second = [t.token_id for t in Sampler(VOCAB)(logits, requests)]
    assert first == second
    assert len(set(first)) > 4  # flat distribution: different seeds pick different tokens


def other_requests() -> list:
    return [
        build_request(),
        build_request(do_sample=True, seed=11, top_k=3),
        build_request(repetition_penalty=1.4, frequency_penalty=0.3),
        build_request(do_sample=True, seed=12, typical_p=0.4, top_n_tokens=3),
        build_request(watermark=True, seed=13, do_sample=True),
        build_request(do_sample=True, seed=14, temperature=0.2, top_p=0.3),
        build_request(top_n_tokens=5),
        build_request(do_sample=True, seed=15),
    ]


@pytest.mark.parametrize("position", [0, 4, 8])
def test_seeded_sampling_is_batch_invariant(position):
    target = build_request(
        prompt_ids=[1, 9], output_ids=[4, 4], do_sample=True, seed=1234, temperature=1.5,
        top_p=0.95, repetition_penalty=1.1, top_n_tokens=2,
    )  # fmt: skip
    alone_logits = random_logits(1, seed=5)
    alone = Sampler(VOCAB)(alone_logits, [target])[0]
    others = other_requests()
    batch = others[:position] + [target] + others[position:]
    logits = random_logits(9, seed=6)
    logits[position] = alone_logits[0]
    mixed = Sampler(VOCAB)(logits, batch)[position]
    assert mixed == alone


def test_draw_depends_only_on_seed_and_step():
    logits = random_logits(1, seed=7)
    sampler = Sampler(VOCAB)
    a = sampler(logits, [build_request(prompt_ids=[1, 2], output_ids=[8], do_sample=True, seed=5)])
    # another prompt, the same number of generated tokens (and the same logits): the same draw
    b = sampler(logits, [build_request(prompt_ids=[3], output_ids=[6], do_sample=True, seed=5)])
    assert a == b
    assert uniform(5, 0) != uniform(5, 1) != uniform(6, 0)


def test_uniform_is_the_splitmix64_stream():
    assert uniform(0, 0) == (0xE220A8397B1DCDAF >> 11) * 2.0**-53  # splitmix64(0)'s first output
    draws = torch.tensor([uniform(42, k) for k in range(20000)], dtype=torch.float64)
    assert 0.0 <= draws.min() and draws.max() < 1.0
    assert abs(draws.mean().item() - 0.5) < 0.01
    assert torch.histc(draws, bins=10, min=0, max=1).sub(2000).abs().max() < 150


def test_inverse_cdf_never_picks_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25, 0.0, 0.0]]).expand(5, 7)  # [5, 7]
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.75, 1.0 - 2.0**-53], dtype=torch.float64)
    assert sample_from_probs(probs, uniforms).tolist() == [1, 1, 3, 4, 4]
    unnormalised = torch.tensor([[2.0, 0.0, 6.0]])  # rows need not sum to 1
    assert sample_from_probs(unnormalised, torch.tensor([0.26], dtype=torch.float64)).item() == 2


def test_missing_seed_samples_as_seed_zero():
    logits = random_logits(1, seed=8)
    no_seed = Sampler(VOCAB)(logits, [build_request(do_sample=True, seed=None)])
    zero = Sampler(VOCAB)(logits, [build_request(do_sample=True, seed=0)])
    assert no_seed == zero


def test_top_k_one_sampling_equals_greedy():
    logits = random_logits(6, seed=9)
    requests = [build_request(do_sample=True, seed=s, top_k=1) for s in range(6)]
    out = Sampler(VOCAB)(logits, requests)
    assert [t.token_id for t in out] == logits.argmax(-1).tolist()
    assert all(t.logprob == 0.0 for t in out)


@pytest.mark.parametrize("base_seed", [0, 10_000])
def test_two_token_frequencies_follow_probabilities(base_seed):
    requests = [
        build_request(prompt_ids=[0], output_ids=[1] * k, do_sample=True, seed=base_seed + s)
        for s in range(200)
        for k in range(20)
    ]
    logits = torch.log(torch.tensor([[0.3, 0.7]])).expand(len(requests), 2)  # [N, 2]
    out = Sampler(2)(logits, requests)
    frequency = sum(t.token_id for t in out) / len(requests)
    assert abs(frequency - 0.7) < 0.03  # ~4 standard deviations over 4000 draws
    per_step = [sum(out[s * 20 + k].token_id for s in range(200)) / 200 for k in range(20)]
    assert max(abs(f - 0.7) for f in per_step) < 0.15  # every step k draws afresh
    logprob_of = {t.token_id: t.logprob for t in out}
    assert logprob_of[1] == pytest.approx(torch.log(torch.tensor(0.7)).item(), abs=1e-6)


def test_filtered_tokens_are_never_sampled():
    logits = random_logits(1, seed=10).expand(200, VOCAB)  # [200, V]
    requests = [build_request(do_sample=True, seed=s, top_k=3) for s in range(200)]
    allowed = set(logits[0].topk(3).indices.tolist())
    chosen = {t.token_id for t in Sampler(VOCAB)(logits, requests)}
    assert chosen <= allowed and len(chosen) == 3


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="vocab"):
        Sampler(VOCAB)(random_logits(2, vocab=VOCAB + 1), [build_request(), build_request()])
    with pytest.raises(ValueError):
        Sampler(VOCAB)(random_logits(3), [build_request()])
    assert Sampler(VOCAB)(torch.empty(0, VOCAB), []) == []


def forbid(monkeypatch, *names):
    def fail(*args, **kwargs):
        raise AssertionError("a processor this batch does not need was run")

    for name in names:
        monkeypatch.setattr(sampler_module, name, fail)


def test_greedy_batch_takes_the_fast_path(monkeypatch):
    monkeypatch.setattr(Sampler, "process", lambda *args: pytest.fail("fast path expected"))
    out = Sampler(VOCAB)(random_logits(3), [build_request(top_n_tokens=2) for _ in range(3)])
    assert [len(t.top_ids) for t in out] == [2, 2, 2]


def test_only_the_needed_processors_run(monkeypatch):
    forbid(monkeypatch, "apply_top_p", "apply_typical_p", "apply_frequency_penalty")
    forbid(monkeypatch, "apply_temperature")
    logits = random_logits(2)
    requests = [
        build_request(do_sample=True, seed=1, top_k=4),
        build_request(repetition_penalty=2.0),
    ]
    out = Sampler(VOCAB)(logits, requests)
    assert out[0].token_id in logits[0].topk(4).indices.tolist()
