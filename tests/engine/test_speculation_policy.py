"""The speculation policy's decisions from measured step times and acceptance: large batches with
costly verify steps and poor acceptance decode plainly (probing now and then, less and less
often), cheap verifies with good acceptance draft, a request that never has its drafts accepted
stops drafting while its neighbours go on, drafting resumes once probes see acceptance return, and
`always` (TGI's behaviour) drafts every step."""

from __future__ import annotations

from pytgi.engine.speculation_policy import MAX_PROBE_INTERVAL, SpeculationPolicy, batch_bucket
from pytgi.messages.outputs import ScheduledRequest, SchedulerOutput

K = 3


def simulate(policy, ids, steps, decode_s, verify_s, acceptance, model_drafts=False):
    """Run `steps` decode steps of the requests `ids`: a step verifying drafts takes `verify_s`,
    a plain one `decode_s`; request r's drafts are accepted at rate acceptance[r]. With
    `model_drafts`, a request has drafts only when the previous step asked for them (a trained
    speculator); otherwise always (n-gram). Returns the per-step sets of drafting requests."""
    proposed = set(ids)
    history = []
    for _ in range(steps):
        available = proposed if model_drafts else set(ids)
        policy.begin_step([(r, K if r in available else 0) for r in ids])
        drafting = {r for r in ids if r in available and policy.drafts(r)}
        requests = [
            ScheduledRequest(
                r, 100, 1, draft_ids=[7] * K if r in drafting else [], sample=True,
                propose_drafts=model_drafts and policy.propose(r),
            )
            for r in ids
        ]  # fmt: skip
        policy.record_step(SchedulerOutput(requests), verify_s if drafting else decode_s)
        for r in drafting:
            policy.record_acceptance(r, K, round(K * acceptance[r]))
        proposed = {r.request_id for r in requests if r.propose_drafts}
        history.append(drafting)
    return history


def test_batch_16_with_poor_acceptance_decodes_plainly_and_probes_ever_less():
    policy = SpeculationPolicy(K)
    ids = [f"r{i}" for i in range(16)]
    history = simulate(policy, ids, 2000, 0.10, 0.27, dict.fromkeys(ids, 1 / 3))
    drafted = [i for i, step in enumerate(history) if step]
    assert len(drafted) < 20  # the first probes, then every MAX_PROBE_INTERVAL steps at most
    late = [i for i in drafted if i > 1000]
    assert all(b - a >= MAX_PROBE_INTERVAL for a, b in zip(late, late[1:], strict=False))
    assert policy.num_steps_skipped > 1900 and policy.num_steps_drafted == len(drafted)


def test_trained_speculator_proposes_only_for_steps_that_verify():
    policy = SpeculationPolicy(K)
    ids = [f"r{i}" for i in range(16)]
    history = simulate(policy, ids, 600, 0.10, 0.27, dict.fromkeys(ids, 0.0), model_drafts=True)
    assert any(history[:20])  # a verify step was measured
    assert sum(bool(step) for step in history) < 12


def test_cheap_verifies_with_good_acceptance_draft_every_step_but_probes():
    policy = SpeculationPolicy(K)
    history = simulate(policy, ["a"], 500, 0.030, 0.040, {"a": 2 / 3})
    assert sum(bool(step) for step in history) > 480
    assert policy.costs[batch_bucket(1)].decode_s == 0.030  # plain probes keep T_d measured


def test_a_request_whose_drafts_fail_stops_drafting_alone():
    policy = SpeculationPolicy(K)
    history = simulate(policy, ["good", "bad"], 300, 0.030, 0.036, {"good": 1.0, "bad": 0.0})
    late = history[100:]
    assert sum("good" in step for step in late) > 190
    assert sum("bad" in step for step in late) < 20


def test_drafting_resumes_when_acceptance_returns():
    policy = SpeculationPolicy(K)
    simulate(policy, ["a"], 300, 0.030, 0.060, {"a": 0.0})
    assert not policy.drafting
    history = simulate(policy, ["a"], 600, 0.030, 0.060, {"a": 1.0})
    assert policy.drafting
    assert sum(bool(step) for step in history[-200:]) > 190


def test_always_drafts_every_step_as_tgi():
    policy = SpeculationPolicy(K, "always")
    ids = [f"r{i}" for i in range(16)]
    history = simulate(policy, ids, 200, 0.10, 0.50, dict.fromkeys(ids, 0.0))
    assert all(step == set(ids) for step in history)
    assert policy.num_steps_skipped == 0


def test_a_larger_batch_skips_unmeasured_when_a_smaller_one_does_not_pay():
    """A batch-1 verify measured not to pay: a batch of 16 decodes plainly without paying for a
    verify step of its own first (the smaller batch's cost is a lower bound), until a probe."""
    policy = SpeculationPolicy(K)
    simulate(policy, ["a"], 100, 0.030, 0.081, {"a": 0.1})
    ids = [f"r{i}" for i in range(16)]
    history = simulate(policy, ids, 60, 0.10, 0.50, dict.fromkeys(ids, 0.1), model_drafts=True)
    assert not any(history)  # the next probe is kappa * K / PROBE_BUDGET (~85) steps after one
    assert policy.costs[16].verify_s is None and policy.costs[16].decode_s == 0.10
