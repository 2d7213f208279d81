"""`--speculate` on real models leaves every output exactly as it is without it: greedy and seeded
tokens and their log-probabilities, bit for bit, for an fp32 model, a GGUF model (int8
activations), each on-the-fly quantized method with its default numerics, and an int8 KV cache.
Verify rows compute what decode rows compute (docs/KERNELS.md, row invariance), and seeded draws
are keyed by the output index."""

from __future__ import annotations

import pytest
import torch

from pytgi.engine.speculation_policy import SpeculationPolicy
from pytgi.messages.sampling_params import SamplingParams
from pytgi.runtime.llm import LLM

NEW_TOKENS = 32


def _prompts() -> list[list[int]]:
    """Repetitive prompts, so the n-gram proposer drafts (and is sometimes wrong)."""
    g = torch.Generator().manual_seed(7)
    motifs = [torch.randint(5, 384, (n,), generator=g).tolist() for n in (3, 4, 5)]
    return [m * 6 + [9] for m in motifs] + [torch.randint(5, 384, (11,), generator=g).tolist()]


def _run(model_id: str, speculate: int, **options) -> tuple[list, int]:
    llm = LLM(
        model_id,
        block_size=16,
        num_blocks=64,
        speculate=speculate,
        speculation_policy="always",  # every step verifies drafts (TGI's behaviour)
        **options,
    )
    try:
        prompts = _prompts()
        greedy = llm.generate(prompts, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        params = [SamplingParams(temperature=0.9, seed=11 + i) for i in range(len(prompts))]
        seeded = llm.generate(prompts, params, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        accepted = llm.core.stats().num_accepted_draft_tokens
    finally:
        llm.close()
    return [(o.token_ids, o.logprobs) for o in greedy + seeded], accepted


CASES = {
    "fp32": {},
    "eetq": {"quantize": "eetq"},
    "eetq-int8": {"quantize": "eetq", "quantize_activations": "int8"},
    "llm.int8": {"quantize": "bitsandbytes"},
    "nf4": {"quantize": "bitsandbytes-nf4"},
    "int8-kv-cache": {"kv_cache_dtype": "int8"},  # a narrow cache, read in place by the kernels
}


@pytest.mark.parametrize("case", list(CASES))
def test_speculation_changes_nothing_on_the_fly(case, tiny_model_factory):
    torch.set_num_threads(1)
    model = str(tiny_model_factory("llama"))
    plain, _ = _run(model, 0, **CASES[case])
    spec, accepted = _run(model, 4, **CASES[case])
    assert accepted > 0
    assert spec == plain  # tokens and log-probabilities, exactly


def test_speculation_changes_nothing_on_a_gguf_model(mixed_gguf):
    torch.set_num_threads(1)
    plain, _ = _run(str(mixed_gguf[0]), 0)
    spec, accepted = _run(str(mixed_gguf[0]), 4)
    assert accepted > 0
    assert spec == plain


class Alternating(SpeculationPolicy):
    """Drafts in two steps of every three and proposes accordingly: speculation switched on and
    off mid-request, the way the adaptive policy switches it, on a fixed schedule."""

    def _choose(self, decoding):
        ids = {rid for rid, _ in decoding}
        return (ids if self.step % 3 else set()), (ids if (self.step + 1) % 3 else set())


def _run_switching(model_id: str, speculate: int) -> tuple[list, object]:
    """As `_run`, with the drafts switched on and off (`speculate` 0: as many as the heads)."""
    llm = LLM(model_id, block_size=16, num_blocks=64, speculate=speculate)
    scheduler = llm.core.scheduler
    config = scheduler.config
    scheduler.policy = Alternating(config.num_speculative_tokens, model_drafts=config.model_drafts)
    execute = llm.core.executor.execute

    def proposing_only_where_asked(output, masks=None):
        """A trained speculator drafts for the requests asked (`propose_drafts`) and no other."""
        result = execute(output, masks)
        asked = {r.request_id for r in output.requests if r.propose_drafts and r.sample}
        assert set(result.draft_ids) == (asked if scheduler.config.model_drafts else set())
        unasked[0] += sum(r.sample and not r.propose_drafts for r in output.requests)
        return result

    unasked = [0]

    llm.core.executor.execute = proposing_only_where_asked
    try:
        prompts = _prompts()
        greedy = llm.generate(prompts, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        params = [SamplingParams(temperature=0.9, seed=11 + i) for i in range(len(prompts))]
        seeded = llm.generate(prompts, params, max_new_tokens=NEW_TOKENS, ignore_eos=True)
        stats = llm.core.stats()
    finally:
        llm.close()
    assert unasked[0] > 0  # the policy also left proposals off
    return [(o.token_ids, o.logprobs) for o in greedy + seeded], stats


@pytest.mark.parametrize("drafts", ["ngram", "mlp"])
def test_switching_speculation_on_and_off_mid_request_changes_nothing(
    drafts, tiny_model_factory, tmp_path
):
    """Tokens and log-probabilities bit-identical to no speculation when the policy turns drafts
    (and a trained speculator's proposals) on and off between the steps of a request."""
    from fixtures.speculators import make_mlp_speculator

    torch.set_num_threads(1)
    model = tiny_model_factory("llama")
    plain, _ = _run(str(model), 0)
    if drafts == "ngram":
        switched, stats = _run_switching(str(model), 4)
    else:
        switched, stats = _run_switching(str(make_mlp_speculator(model, tmp_path / "mlp", 3)), 0)
    assert stats.num_speculation_steps_drafted > 0 and stats.num_speculation_steps_skipped > 0
    assert stats.num_draft_tokens > 0
    if drafts == "ngram":
        assert stats.num_accepted_draft_tokens > 0
    assert switched == plain
