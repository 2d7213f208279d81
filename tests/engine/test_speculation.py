"""Speculation (`--speculate`): n-gram drafts, several tokens per request and step, rollback of
rejected drafts. A request's output must be exactly what it is without speculation, with chunked
prefill, prefix hits and preemption in play; accepted drafts must save steps."""

from __future__ import annotations

from engine.fakes import FakeExecutor
from engine.test_scheduler import request, run_all

from pytgi.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pytgi.engine.engine_core import EngineCore
from pytgi.engine.request import Request
from pytgi.engine.speculation import NgramProposer


def periodic_with_surprises(history: list[int]) -> int:
    """Mostly repeats the token 3 back (n-gram drafts hit), every 7th position something new (the
    drafts that cross it are rejected)."""
    if len(history) % 7 == 0 or len(history) < 3:
        return (sum(history) * 31 + len(history)) % 1000
    return history[-3]


def make_core(
    speculate: int, num_blocks: int = 64, prefill: int = 16, kv_groups=(), policy="always"
):
    config = EngineConfig(
        model=ModelConfig("fake"),
        cache=CacheConfig(block_size=4),
        scheduler=SchedulerConfig(
            max_batch_prefill_tokens=prefill,
            num_speculative_tokens=speculate,
            speculation_policy=policy,  # TGI's: every step with drafts verifies them
        ),
    )
    executor = FakeExecutor(num_blocks, 4, next_token=periodic_with_surprises, kv_groups=kv_groups)
    return EngineCore(config, executor, executor.initialize()), executor


PROMPTS = {
    "a": [5, 6, 7, 5, 6, 7, 5, 6],
    "b": list(range(100, 130)),  # chunked: longer than the step budget
    "c": [5, 6, 7, 5, 6, 7, 5, 6, 9, 9],  # shares a full block with "a": a prefix hit
    "d": [1, 2],
}


def run(speculate: int, num_blocks: int = 64, kv_groups=()):
    core, executor = make_core(speculate, num_blocks, kv_groups=kv_groups)
    for rid, prompt in PROMPTS.items():
        core.add_request(request(rid, prompt, max_new=30))
    outputs, finished = run_all(core)
    return outputs, finished, core, executor


def test_outputs_are_unchanged_and_steps_are_saved():
    plain, _, _, plain_executor = run(0)
    spec, finished, core, executor = run(4)
    assert spec == plain
    assert all(len(out) == 30 for out in spec.values())
    assert all(f.finish_reason.value == "length" for f in finished.values())
    stats = core.stats()
    assert stats.num_accepted_draft_tokens > 0
    assert stats.num_draft_tokens > stats.num_accepted_draft_tokens  # some were rejected
    assert len(executor.steps) < len(plain_executor.steps)
    assert core.scheduler.kv.num_free_blocks == 64  # every block back, drafts' included


def test_preemption_with_drafts_keeps_outputs():
    plain, _, _, _ = run(0)
    spec, _, core, _ = run(4, num_blocks=20)  # too few blocks for all four at once
    assert core.stats().num_preemptions > 0
    assert spec == plain


def test_drafts_stop_at_max_new_tokens_and_eos():
    core, executor = make_core(4)
    core.add_request(request("a", [5, 6, 7, 5, 6, 7], max_new=3))
    eos = periodic_with_surprises([5, 6, 7, 5, 6, 7, 5])  # the second generated token
    core.add_request(request("e", [5, 6, 7, 5, 6, 7], max_new=20, eos=(eos,)))
    outputs, finished = run_all(core)
    assert len(outputs["a"]) == 3 and finished["a"].finish_reason.value == "length"
    assert outputs["e"][-1] == eos and finished["e"].finish_reason.value == "eos_token"
    for step in executor.steps:  # never draft past max_new_tokens
        for r in step.requests:
            if r.request_id == "a":
                assert r.start_pos + r.num_scheduled_tokens <= 6 + 3


def test_ngram_proposer_finds_the_latest_match_longest_first():
    proposer = NgramProposer(num_speculative_tokens=3)
    r = Request("r", [1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], None, None, 0.0)
    assert proposer.propose(r, max_tokens=10) == [4, 5, 1]  # after the latest "1 2 3"
    r.output_ids.append(7)  # "3 7" never seen; "7" never seen
    assert proposer.propose(r, max_tokens=10) == []
    r.output_ids += [1, 2]  # "7 1 2" unseen, "1 2" -> latest is before the final one: 3 4
    assert proposer.propose(r, max_tokens=2) == [3, 7]
    assert proposer.propose(r, max_tokens=0) == []


def test_drafts_with_a_window_group_keep_outputs():
    """A window-8 group beside the full one (Gemma's layout, the window group scarce): drafts
    written to both groups and rolled back, window blocks given back, preemption: the outputs
    are the plain run's and every block of both groups comes back."""
    plain, _, _, _ = run(0)
    spec, _, core, _ = run(4, num_blocks=40, kv_groups=((None, 40), (8, 12)))
    assert spec == plain
    assert core.stats().num_accepted_draft_tokens > 0
    assert [g.pool.num_free_blocks for g in core.scheduler.kv.groups] == [40, 12]


def test_the_adaptive_policy_keeps_outputs_whatever_it_decides():
    """The default policy decides from wall times (here, the fake executor's: noise), so its
    decisions vary from run to run; the outputs may not."""
    plain, _, _, _ = run(0)
    core, _ = make_core(4, policy="adaptive")
    for rid, prompt in PROMPTS.items():
        core.add_request(request(rid, prompt, max_new=30))
    outputs, _ = run_all(core)
    assert outputs == plain
    stats = core.stats()
    assert stats.num_speculation_steps_drafted + stats.num_speculation_steps_skipped > 0
    assert core.scheduler.kv.num_free_blocks == 64
