"""Quantized weights through the whole engine: a request's tokens and logprobs are the same alone
(one request at a time: a whole-prompt prefill, then batch-1 decode steps on the fused decode
stack) and inside mixed batches with chunked prefill, prefix-cache hits and preemption (the
layer-by-layer path, prefill and decode rows in one step). Each quantized row is computed with
one arithmetic whatever the batch (activations quantised per row), so the outputs are identical.
"""

from __future__ import annotations

import pytest
import torch
from models.runner_utils import prompt

from pytgi.runtime.llm import LLM

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def prompts():
    shared = prompt(20, 1)
    mixed = [prompt(3, 2), prompt(29, 3), shared + prompt(5, 4), prompt(12, 5)]
    hits = [shared + prompt(9, 6), shared[:16] + prompt(2, 7)]
    crowd = [prompt(8 + 3 * i, 10 + i) for i in range(6)]
    return mixed, hits, crowd


def alone(llm: LLM, ids: list[int]):
    return llm.generate([ids], max_new_tokens=NEW_TOKENS, ignore_eos=True)[0]


def check_batch_invariance(model_id: str, prompts, fused: bool, **options) -> None:
    torch.set_num_threads(1)
    mixed, hits, crowd = prompts
    single = LLM(model_id, block_size=16, num_blocks=64, enable_prefix_caching=False, **options)
    try:
        assert (single.core.executor.worker.runner.accelerator is not None) == fused
        refs = {tuple(ids): alone(single, ids) for ids in mixed + hits + crowd}
    finally:
        single.close()
    # 4-token blocks, a 16-token step budget (prompts are chunked, decodes mix with prefills) and
    # 40 blocks: the crowd of six 40-token sequences cannot fit at once, so requests get preempted
    llm = LLM(model_id, block_size=4, num_blocks=40, max_batch_prefill_tokens=16, **options)
    try:
        for group in (mixed, hits, crowd):
            outputs = llm.generate(group, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            for out, ids in zip(outputs, group, strict=True):
                assert out.token_ids == refs[tuple(ids)].token_ids
                assert out.logprobs == pytest.approx(refs[tuple(ids)].logprobs, abs=1e-5)
            if group is hits:
                assert [o.num_cached_tokens for o in outputs] == [20, 16]
        assert llm.core.scheduler.num_preemptions > 0
    finally:
        llm.close()


# (method, --quantize-activations, whether decode steps run on the fused stack): it takes
# int8-activation kernels only; LLM.int8's fp32 outlier features and every fp32-activation method
# (TGI's default for eetq, NF4 / FP4, fp8) stay on the layer-by-layer path
CASES = [
    ("eetq", None, False),
    ("eetq", "int8", True),
    ("bitsandbytes-nf4", None, False),
    ("bitsandbytes", None, False),
    ("fp8", None, False),
]


@pytest.mark.parametrize(("method", "acts", "fused"), CASES)
def test_on_the_fly_methods_are_batch_invariant(method, acts, fused, tiny_model_factory, prompts):
    model_dir = tiny_model_factory("llama")
    options = {"quantize": method, "quantize_activations": acts}
    check_batch_invariance(str(model_dir), prompts, fused, **options)


def test_gguf_types_are_batch_invariant(mixed_gguf, prompts):
    """Every GGUF block type (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; a BF16 embedding
    and an F16 head) on their kernels."""
    check_batch_invariance(str(mixed_gguf[0]), prompts, fused=True)


@pytest.mark.parametrize("fmt", ["gptq", "fp8"])
def test_prequantized_checkpoints_are_batch_invariant(fmt, tiny_llama_dir, tmp_path, prompts):
    """A GPTQ act-order checkpoint (its input gather included) and a block-scaled FP8 one, on
    the fp32-activation kernels (layer by layer: the fused stack takes int8 activations)."""
    from fixtures.prequantized import build_checkpoint

    build_checkpoint(tiny_llama_dir, tmp_path / fmt, fmt)
    check_batch_invariance(str(tmp_path / fmt), prompts, fused=False)
