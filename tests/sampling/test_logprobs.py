"""Top-n alternatives (TGI's tie handling) and prefill logprobs."""

from __future__ import annotations

import math

import torch

from pytgi.sampling import logprobs as logprobs_module
from pytgi.sampling.logprobs import compute_prefill_logprobs, compute_top_n


def test_top_n_ties_at_the_nth_value_are_all_returned():
    lp = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 1.0, 1.0, -2.0]]), -1)  # [1, 6]
    ids, values = compute_top_n(lp, [2])
    assert ids[0][0] == 1 and sorted(ids[0][1:]) == [2, 3, 4]
    assert values[0] == sorted(values[0], reverse=True)
    assert values[0][0] == lp[0, 1].item()


def test_top_n_per_row_and_minus_inf_never_returned():
    lp = torch.tensor(
        [
            [-0.1, -3.0, -2.0, -float("inf")],
            [-1.0, -0.5, -4.0, -2.0],
            [-0.2, -float("inf"), -float("inf"), -1.7],
        ]
    )
    ids, values = compute_top_n(lp, [3, 0, 4])
    assert ids == [[0, 2, 1], [], [0, 3]]
    assert values == [[lp[0, 0].item(), -2.0, -3.0], [], [lp[2, 0].item(), lp[2, 3].item()]]


def test_top_n_larger_than_vocab():
    lp = torch.log_softmax(torch.tensor([[1.0, 2.0]]), -1)
    assert compute_top_n(lp, [5])[0] == [[1, 0]]


def test_prefill_logprobs_match_log_softmax(monkeypatch):
    monkeypatch.setattr(logprobs_module, "PREFILL_CHUNK_ROWS", 7)  # several chunks
    logits = torch.randn(20, 33)  # [T, V]
    targets = torch.randint(0, 33, (20,))  # [T]
    expected = torch.log_softmax(logits, -1).gather(1, targets.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(compute_prefill_logprobs(logits, targets), expected)
    half = compute_prefill_logprobs(logits.to(torch.bfloat16), targets)
    assert half.dtype == torch.float32 and not any(math.isnan(v) for v in half.tolist())
