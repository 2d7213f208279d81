"""Logit and greedy-token parity with transformers (eager, fp32) for every architecture in ARCHS,
through the ModelRunner with hand-built scheduler steps: mixed prompts, chunked prefill mixed with
decodes, prefix-cache hits, and 32+ greedy decode steps. `arch@transformers` rows force a native
architecture through the transformers fallback (Mistral: the sliding window it passes to the
attention function; Gemma 2: the soft-cap).
"""

from __future__ import annotations

import pytest
import torch
from fixtures.tiny_models import ARCHS
from models.runner_utils import (
    BlockAllocator,
    hf_logits,
    load_hf,
    make_runner,
    prompt,
    scheduled,
    step,
)

ATOL = 1e-4


FORCED_FALLBACK = ["mistral@transformers", "gemma2@transformers"]


@pytest.fixture(scope="module", params=list(ARCHS) + FORCED_FALLBACK)
def pair(request, tiny_model_factory):
    torch.set_num_threads(1)
    arch, _, implementation = request.param.partition("@")
    model_dir = tiny_model_factory(arch)
    runner = make_runner(model_dir, implementation=implementation or "auto")
    return request.param, runner, load_hf(model_dir)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    diff = (actual - expected).abs().max().item()
    assert diff <= ATOL, f"{what}: max |logit diff| {diff:.2e} > {ATOL}"


def test_mixed_prompts_in_one_step(pair):
    arch, runner, hf = pair
    blocks = BlockAllocator()
    prompts = [prompt(n, seed=n) for n in (1, 7, 16, 33)]
    out = step(
        *(scheduled(f"r{i}", p, 0, len(p), blocks.take(len(p))) for i, p in enumerate(prompts))
    )
    logits = runner.forward(out)  # [4, V]
    for i, p in enumerate(prompts):
        assert_close(logits[i], hf_logits(hf, p)[-1], f"{arch} prompt of {len(p)}")


def test_chunked_prefill_mixed_with_decode(pair):
    arch, runner, hf = pair
    blocks = BlockAllocator()
    a, b = prompt(40, seed=1), prompt(12, seed=2)
    a_blocks, b_blocks = blocks.take(40), blocks.take(12 + 2)
    logits = runner.forward(
        step(scheduled("a", a, 0, 16, a_blocks, sample=False), scheduled("b", b, 0, 12, b_blocks))
    )
    assert logits.shape[0] == 1
    assert_close(logits[0], hf_logits(hf, b)[-1], f"{arch} b prefill")
    for start, end in ((16, 32), (32, 40)):
        b = b + [int(logits[-1].argmax())]
        out = step(
            scheduled("a", a, start, end, a_blocks, sample=end == 40),
            scheduled("b", b, len(b) - 1, len(b), b_blocks, num_prompt=12),
        )
        logits = runner.forward(out)
        assert_close(logits[-1], hf_logits(hf, b)[-1], f"{arch} b decode at {len(b)}")
    assert_close(logits[0], hf_logits(hf, a)[-1], f"{arch} a after 3 chunks")


def test_prefix_cache_hit(pair):
    arch, runner, hf = pair
    blocks = BlockAllocator()
    a = prompt(40, seed=3)
    a_blocks = blocks.take(40)
    runner.forward(step(scheduled("a", a, 0, 40, a_blocks)))
    b = a[:32] + prompt(9, seed=4)  # shares A's two full blocks
    c = a[:16] + prompt(20, seed=5)  # shares A's first block
    b_blocks = a_blocks[:2] + blocks.take(9)
    c_blocks = a_blocks[:1] + blocks.take(20)
    logits = runner.forward(
        step(scheduled("b", b, 32, len(b), b_blocks), scheduled("c", c, 16, len(c), c_blocks))
    )
    assert_close(logits[0], hf_logits(hf, b)[-1], f"{arch} prefix hit at 32")
    assert_close(logits[1], hf_logits(hf, c)[-1], f"{arch} prefix hit at 16")


@torch.no_grad()
def hf_greedy(hf, ids: list[int], num_new: int) -> tuple[list[int], torch.Tensor]:
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=num_new,
        eos_token_id=None,
        pad_token_id=3,
        output_logits=True,
        return_dict_in_generate=True,
    )
    out = hf.generate(torch.tensor([ids]), generation_config=config)
    return out.sequences[0, len(ids) :].tolist(), torch.cat(out.logits)  # [num_new, V]


def test_greedy_decode_matches_generate(pair):
    arch, runner, hf = pair
    num_new = 32
    blocks = BlockAllocator()
    seqs = {"short": prompt(10, seed=6), "long": prompt(40, seed=7)}
    table = {rid: blocks.take(len(ids) + num_new) for rid, ids in seqs.items()}
    lengths = {rid: len(ids) for rid, ids in seqs.items()}
    ours = {rid: [] for rid in seqs}
    logits_per_step = {rid: [] for rid in seqs}
    starts = dict.fromkeys(seqs, 0)
    for _ in range(num_new):
        out = step(
            *(
                scheduled(rid, ids, starts[rid], len(ids), table[rid], num_prompt=lengths[rid])
                for rid, ids in seqs.items()
            )
        )
        logits = runner.forward(out)
        for row, rid in enumerate(seqs):
            token = int(logits[row].argmax())
            ours[rid].append(token)
            logits_per_step[rid].append(logits[row])
            starts[rid] = len(seqs[rid])
            seqs[rid] = seqs[rid] + [token]
    for rid, n in lengths.items():
        tokens, ref_logits = hf_greedy(hf, seqs[rid][:n], num_new)
        assert ours[rid] == tokens, f"{arch} {rid}: greedy tokens differ"
        assert_close(torch.stack(logits_per_step[rid]), ref_logits, f"{arch} {rid} decode")
