"""The Sampler on a CUDA device: same processing as on CPU, and batch-invariant there too."""

from __future__ import annotations

import pytest
import torch

from pytgi.sampling.metadata import SamplingMetadata
from pytgi.sampling.sampler import Sampler

from .conftest import build_request
from .test_sampler import other_requests

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

VOCAB = 32000


def random_logits(num_rows: int, seed: int) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def test_processing_matches_cpu():
    requests = other_requests()
    logits = random_logits(len(requests), seed=0)  # [B, V]
    sampler = Sampler(VOCAB)
    cpu = sampler.process(logits, SamplingMetadata.from_rows(requests, VOCAB, "cpu"))
    md = SamplingMetadata.from_rows(requests, VOCAB, "cuda")
    gpu = sampler.process(logits.cuda(), md).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)  # -inf positions must agree too
    cpu_out = sampler(logits, requests)
    gpu_out = sampler(logits.cuda(), requests)
    for a, b in zip(cpu_out, gpu_out, strict=True):
        assert a.token_id == b.token_id
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert a.top_ids[:1] == b.top_ids[:1]


@pytest.mark.parametrize("position", [0, 5])
def test_seeded_sampling_is_batch_invariant_on_cuda(position):
    target = build_request(
        prompt_ids=[1, 9], output_ids=[4], do_sample=True, seed=99, top_p=0.9,
        repetition_penalty=1.2, top_n_tokens=3,
    )  # fmt: skip
    alone_logits = random_logits(1, seed=1).cuda()
    alone = Sampler(VOCAB)(alone_logits, [target])[0]
    others = other_requests()
    logits = random_logits(len(others) + 1, seed=2).cuda()
    logits[position] = alone_logits[0]
    batch = others[:position] + [target] + others[position:]
    assert Sampler(VOCAB)(logits, batch)[position] == alone


def test_seeded_draws_equal_the_cpu_draws():
    """Same logits on both devices: every seeded row draws the same token (one uniform per row
    from (seed, step), an inverse-CDF search over a float64 cumsum, on either device)."""
    rows = [
        build_request(prompt_ids=[1, 2 + i], output_ids=[4] * (i % 3), do_sample=True,
                      seed=1000 + i, temperature=0.7 + 0.1 * (i % 4), top_k=50 * (i % 2))
        for i in range(48)
    ]  # fmt: skip
    logits = random_logits(len(rows), seed=3)
    cpu = Sampler(VOCAB)(logits, rows)
    gpu = Sampler(VOCAB)(logits.cuda(), rows)
    assert [t.token_id for t in gpu] == [t.token_id for t in cpu]
    for a, b in zip(cpu, gpu, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
