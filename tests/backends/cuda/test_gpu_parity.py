"""On the GPU, against transformers: every tiny architecture in fp32 gives transformers' greedy
tokens for 32 decode steps, with CUDA graphs (a batch of 3 replays the graph of 4) and without;
in bf16 the logits stay within bf16 tolerance and the teacher-forced top-1 tokens agree."""

from __future__ import annotations

import pytest
import torch
from backends.cuda.gpu import cuda_runner, load_hf_cuda, record, requires_gpu
from fixtures.tiny_models import ARCHS
from models.runner_utils import BlockAllocator, prompt, scheduled, step

pytestmark = requires_gpu

GRAPHS = {"graphs": (1, 2, 4, 8), "eager": ()}
NUM_NEW = 32


@torch.no_grad()
def hf_next_logits(hf, sequences: list[list[int]]) -> list[torch.Tensor]:
    return [hf(torch.tensor([ids], device="cuda")).logits[0].float() for ids in sequences]


def decode_teacher_forced(runner, sequences: dict[str, list[int]], num_prompt: dict[str, int]):
    """Prefill every prompt, then one decode step per remaining token of all rows together;
    returns each row's logits [len - num_prompt + 1, V] (predicting tokens num_prompt..)."""
    blocks = BlockAllocator()
    tables = {rid: blocks.take(len(ids) + 1) for rid, ids in sequences.items()}
    out = {rid: [] for rid in sequences}
    position = dict(num_prompt)
    first = True
    while any(position[r] <= len(ids) for r, ids in sequences.items()):
        rids = [r for r, ids in sequences.items() if position[r] <= len(ids)]
        work = step(
            *(scheduled(r, sequences[r][: position[r]], 0 if first else position[r] - 1,
                        position[r], tables[r], num_prompt=num_prompt[r]) for r in rids)
        )  # fmt: skip
        logits = runner.forward(work).float()
        for row, r in enumerate(rids):
            out[r].append(logits[row])
            position[r] += 1
        first = False
    return {r: torch.stack(rows) for r, rows in out.items()}


# every architecture with graphs; the eager path (the same kernels, not replayed) on a few
FP32_CASES = [(arch, "graphs") for arch in ARCHS] + [
    (arch, "eager") for arch in ("llama", "mistral", "qwen3")
]


@pytest.mark.parametrize(("arch", "mode"), FP32_CASES)
def test_fp32_greedy_matches_transformers(tiny_model_factory, arch, mode):
    model_dir = tiny_model_factory(arch)
    check_fp32_greedy(model_dir, load_hf_cuda(model_dir, torch.float32), mode, arch)


def check_fp32_greedy(model_dir, hf, mode: str, label: str, max_diff: float = 2e-4) -> None:
    """pytgi in fp32 on the GPU (CUDA graphs on or not, by `mode`) against transformers' `hf`
    (fp32, on the GPU): 3 prompts, 32 greedy tokens each, decoded together teacher-forced; the
    same tokens and logits within `max_diff`."""
    from transformers import GenerationConfig

    runner = cuda_runner(model_dir, "float32", GRAPHS[mode])
    prompts = {"a": prompt(5, seed=1), "b": prompt(23, seed=2), "c": prompt(40, seed=3)}
    config = GenerationConfig(do_sample=False, max_new_tokens=NUM_NEW, pad_token_id=3)
    expected = {
        r: hf.generate(torch.tensor([ids], device="cuda"), generation_config=config)[0].tolist()
        for r, ids in prompts.items()
    }
    logits = decode_teacher_forced(runner, expected, {r: len(p) for r, p in prompts.items()})
    for r, ids in prompts.items():
        ours = logits[r][:-1].argmax(-1).tolist()  # the last row predicts past the reference
        assert ours == expected[r][len(ids) :], f"{label} {mode} {r}: greedy tokens differ"
        reference = torch.cat(hf_next_logits(hf, [expected[r][:-1]]))[len(ids) - 1 :]
        diff = (logits[r][:-1] - reference).abs().max().item()
        assert diff < max_diff, f"{label} {mode} {r}: max |logit diff| {diff:.2e}"


def bf16_comparison(model_dir, num_prompt: int, num_tokens: int, vocab: int, hf_dir=None) -> dict:
    """pytgi in bf16 (teacher-forced decode, with graphs and without) against transformers in
    bf16 and fp32, on 4 sequences of random tokens: the logits predicting tokens num_prompt ..
    num_tokens (the last one past the sequence). One dict of figures per pytgi mode. `hf_dir`:
    transformers' checkpoint when it is not `model_dir` (a quantized model's dense reference)."""
    generator = torch.Generator().manual_seed(0)
    sequences = {
        f"r{i}": torch.randint(4, vocab, (num_tokens,), generator=generator).tolist()
        for i in range(4)
    }
    ours = {}
    for mode, graphs in GRAPHS.items():
        runner = cuda_runner(model_dir, "bfloat16", graphs, num_blocks=4 * (num_tokens // 16 + 2))
        rows = decode_teacher_forced(runner, sequences, dict.fromkeys(sequences, num_prompt))
        ours[mode] = torch.cat([rows[r] for r in sequences])  # [N, V]: row j predicts p + j
        del runner, rows
    reference = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        hf = load_hf_cuda(hf_dir or model_dir, dtype)
        logits = hf_next_logits(hf, list(sequences.values()))
        reference[name] = torch.cat([row[num_prompt - 1 :] for row in logits])  # [N, V]
        del hf, logits
    return {mode: agreement(logits, **reference) for mode, logits in ours.items()}


def agreement(ours: torch.Tensor, bf16: torch.Tensor, fp32: torch.Tensor) -> dict:
    def top1(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a.argmax(-1) == b.argmax(-1)).float().mean().item()

    return {
        "positions": ours.shape[0],
        "top1_vs_hf_bf16": top1(ours, bf16),
        "top1_vs_hf_fp32": top1(ours, fp32),
        "hf_bf16_top1_vs_fp32": top1(bf16, fp32),
        "mean_abs_err_vs_fp32": (ours - fp32).abs().mean().item(),
        "hf_bf16_mean_abs_err_vs_fp32": (bf16 - fp32).abs().mean().item(),
        "max_abs_diff_vs_hf_bf16": (ours - bf16).abs().max().item(),
        "logit_scale": fp32.abs().max().item(),
    }


def assert_bf16_quality(stats: dict) -> None:
    """bf16 tolerance: pytgi's error against fp32 is no larger than transformers' own bf16 error
    (x1.5); top-1 agreement >= 99% with transformers' bf16 tokens, or (random weights can leave
    the top two logits closer than bf16 resolves) no worse than transformers' bf16 against fp32."""
    hf_error = stats["hf_bf16_mean_abs_err_vs_fp32"]
    assert stats["mean_abs_err_vs_fp32"] <= 1.5 * hf_error + 1e-3, stats
    assert (
        stats["top1_vs_hf_bf16"] >= 0.99
        or stats["top1_vs_hf_fp32"] >= stats["hf_bf16_top1_vs_fp32"] - 0.01
    ), stats


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_bf16_tiny_models_logits_and_top1(tiny_model_factory, arch):
    results = bf16_comparison(tiny_model_factory(arch), 16, 96, vocab=384)
    record(f"bf16_tiny_{arch}", results)
    for stats in results.values():
        assert_bf16_quality(stats)
