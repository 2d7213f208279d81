"""When speculation pays: each step, which requests verify their drafts (and, with a trained
speculator, which ones the workers should draft for the next step). Plain data; the engine feeds
it the wall time of every step and the scheduler the drafts each request had accepted.

TGI verifies drafts in every step. pytgi's default (`adaptive`) drafts only when the measured
numbers say it gains tokens per second (docs/SPECULATION.md, docs/TGI_COMPATIBILITY.md);
`always` is TGI's behaviour. Outputs never depend on the choice: a verify row computes what a
decode row computes, and seeded draws are keyed by the output index.

Measured quantities, all decaying averages:
- a_r: per request, draft tokens accepted per draft token verified (a new sample weighs more
  after a pause, up to STALE_WEIGHT; new requests start at the global average, or at 1 before
  any draft was verified);
- per batch-size bucket: T_d, the time of a step of B one-token decodes (no drafts, nothing
  proposed), and T_v with D/B, the time of a step verifying D drafts over B requests.

Cost model: a verify step with D drafts over B requests costs T_d (1 + kappa D / B), kappa fitted
at the measured point: kappa = (T_v / T_d - 1) / (D / B). Drafting the set S gives B + sum a_r d_r
tokens per step, so in tokens per T_d the rate is R(S) = (B + sum a_r d_r) / (1 + kappa sum d_r /
B); a request raises the rate exactly when a_r > kappa R(S) / B. Requests are taken in order of
a_r while that holds (none taken: R = B, plain decode).

Probing keeps the numbers fresh: every `interval` steps the opposite of the current regime runs
once (a drafting step while skipping, a plain step while drafting); the interval doubles (up to
MAX_PROBE_INTERVAL) while probes do not change the regime, and drops back when one does; while
skipping, probes are at least kappa k / PROBE_BUDGET steps apart. A bucket with no verify time of
its own takes the largest kappa measured at a smaller bucket as a lower bound; when that does not
rule drafting out, it runs a plain step first (no decode time yet), then a drafting one.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytgi.messages.outputs import SchedulerOutput

ACCEPTANCE_DECAY = 0.3  # weight of a request's newest verify step in its a_r, per step since
STALE_WEIGHT = 0.5  # ... up to this after a pause (a probe sees what changed meanwhile)
GLOBAL_DECAY = 0.05  # weight of one request-step in the global acceptance prior
COST_DECAY = 0.2  # weight of the newest step time in T_d / T_v
MIN_PROBE_INTERVAL = 8
MAX_PROBE_INTERVAL = 256
PROBE_BUDGET = 0.02  # while skipping, probes may cost this share of the time (expected)


def batch_bucket(num_requests: int) -> int:
    """1, 2, 3, 4, then the next power of two: step costs are kept per bucket."""
    if num_requests <= 4:
        return num_requests
    return 1 << (num_requests - 1).bit_length()


def _decay(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)


@dataclass
class StepCosts:
    decode_s: float | None = None  # T_d
    verify_s: float | None = None  # T_v
    drafts_per_request: float | None = None  # D / B of the verify steps

    def kappa(self) -> float | None:
        """Extra verify cost per draft token per request, in units of T_d (None: unmeasured)."""
        if self.decode_s is None or self.verify_s is None or not self.drafts_per_request:
            return None
        return max(self.verify_s / self.decode_s - 1.0, 0.0) / self.drafts_per_request


class SpeculationPolicy:
    def __init__(
        self, num_speculative_tokens: int, policy: str = "adaptive", model_drafts: bool = False
    ):
        self.k = num_speculative_tokens
        self.model_drafts = model_drafts  # drafts exist only where proposals were asked for
        self.always = policy == "always"
        self.acceptance: dict[str, float] = {}  # a_r
        self.last_verified: dict[str, int] = {}  # the step a_r was last updated at
        self.global_acceptance: float | None = None
        self.costs: dict[int, StepCosts] = {}
        self.step = 0
        self.probe_interval = MIN_PROBE_INTERVAL
        self.last_probe = 0  # the step of the last probe
        self._probe_from: bool | None = None  # the regime a probe left, until the next decision
        self.drafting = True  # the regime of the last non-probe decision
        self._draft_now: set[str] = set()
        self._propose_next: set[str] = set()
        self._withheld: set[str] = set()
        self._decided: set[str] = set()  # the requests of the last begin_step
        self._propose_new = True  # for requests admitted after it (their first token's step)
        # /metrics: steps where drafts were verified / where drafts were there (or, from a
        # trained speculator, could have been asked for) and none were
        self.num_steps_drafted = 0
        self.num_steps_skipped = 0

    # -- decisions ---------------------------------------------------------------------------

    def begin_step(self, decoding: list[tuple[str, int]]) -> None:
        """Decide this step: `decoding` lists (request id, drafts it has) for the running
        requests; afterwards `drafts(id)` and `propose(id)` answer for each."""
        self.step += 1
        ids = [rid for rid, _ in decoding]
        # requests whose proposals were withheld last step (a trained speculator's: no drafts)
        self._withheld = {r for r in ids if not self.propose(r)} if self.model_drafts else set()
        self._decided = set(ids)
        self._draft_now, self._propose_next = self._choose(decoding)
        self._count(decoding)

    def _choose(self, decoding: list[tuple[str, int]]) -> tuple[set[str], set[str]]:
        """(requests verifying drafts now, requests to draft for next step)."""
        ids = [rid for rid, _ in decoding]
        if self.always:
            return set(ids), set(ids)
        num = len(decoding)
        costs = self.costs.get(batch_bucket(num), StepCosts())
        kappa, measured = self._kappa(batch_bucket(num))
        if self._probe_due(self.step, kappa):  # the opposite regime, once
            self._probe_from = self.drafting
            self.last_probe = self.step
            # a plain probe proposes nothing either, so its time is the decode cost
            chosen = proposed = set() if self.drafting else set(ids)
        else:
            chosen = self._decide(num, costs, kappa, measured, decoding)
            proposed = self._plan_proposals(num, costs, kappa, measured, ids)
        self._propose_new = bool(proposed) or (self.drafting and not ids)
        return chosen, proposed

    def _kappa(self, bucket: int) -> tuple[float | None, bool]:
        """(kappa, measured): the bucket's own when measured; else the largest measured at a
        smaller bucket, a lower bound (a step's extra rows cost relatively more as the batch
        grows: the forward turns compute-bound); None when nothing is measured below."""
        own = self.costs.get(bucket, StepCosts()).kappa()
        if own is not None:
            return own, True
        smaller = [c.kappa() for b, c in self.costs.items() if b < bucket]
        smaller = [k for k in smaller if k is not None]
        return (max(smaller) if smaller else None), False

    def _decide(self, num, costs: StepCosts, kappa, measured, decoding) -> set[str]:
        if measured:
            chosen = self._select(num, kappa, decoding)
            if any(d for _, d in decoding):
                self._set_regime(bool(chosen))
            return chosen
        if kappa is not None and not self._select(num, kappa, [(r, self.k) for r, _ in decoding]):
            self._set_regime(False)  # even the smaller batches' cost says it does not pay
            return set()
        if costs.decode_s is None:
            return set()  # measure a plain step first
        return {r for r, d in decoding if d}  # then a verifying one

    def _set_regime(self, drafting: bool) -> None:
        """The regime of a decision; the first after a probe sets the next probe's interval:
        doubled when the probe left the regime as it was, back to the minimum when it did not."""
        if self._probe_from is not None:
            grown = min(self.probe_interval * 2, MAX_PROBE_INTERVAL)
            self.probe_interval = grown if drafting == self._probe_from else MIN_PROBE_INTERVAL
            self._probe_from = None
        self.drafting = drafting

    def _probe_due(self, step: int, kappa: float | None) -> bool:
        """A probe every `probe_interval` steps; while skipping, no more often than keeps its
        expected cost (kappa k extra decode-step times) within PROBE_BUDGET of the time."""
        floor = kappa * self.k / PROBE_BUDGET if kappa is not None and not self.drafting else 0.0
        return step - self.last_probe >= max(self.probe_interval, floor)

    def _plan_proposals(self, num, costs: StepCosts, kappa, measured, ids) -> set[str]:
        """Which requests the trained speculator drafts for the next step (its proposals cost a
        pass of its heads, so none are made for a step that will not verify them)."""
        if self._probe_due(self.step + 1, kappa):
            return set() if self.drafting else set(ids)
        if kappa is not None:
            chosen = self._select(num, kappa, [(r, self.k) for r in ids])
            if measured or not chosen:
                return chosen
        if costs.decode_s is None:
            return set()
        return set(ids)

    def _select(self, num: int, kappa: float | None, candidates: list[tuple[str, int]]) -> set:
        """The requests whose drafts raise tokens per second, best acceptance first."""
        if kappa is None or num == 0:
            return {r for r, d in candidates if d}
        ranked = sorted(
            ((self._acceptance(r), r, d) for r, d in candidates if d), key=lambda x: -x[0]
        )
        gained = drafted = 0.0
        chosen = set()
        for accept, rid, num_drafts in ranked:
            rate = (num + gained) / (1.0 + kappa * drafted / num)
            if accept <= kappa * rate / num:
                break
            chosen.add(rid)
            gained += accept * num_drafts
            drafted += num_drafts
        return chosen

    def _acceptance(self, request_id: str) -> float:
        prior = 1.0 if self.global_acceptance is None else self.global_acceptance
        return self.acceptance.get(request_id, prior)

    def _count(self, decoding: list[tuple[str, int]]) -> None:
        if any(d and rid in self._draft_now for rid, d in decoding):
            self.num_steps_drafted += 1
        elif any(d or rid in self._withheld for rid, d in decoding):
            self.num_steps_skipped += 1

    def drafts(self, request_id: str) -> bool:
        """Whether the request verifies its drafts in this step."""
        return request_id in self._draft_now

    def propose(self, request_id: str) -> bool:
        """Whether the workers' speculator should draft for the request's next step (one
        admitted in this step: as the current regime)."""
        if request_id not in self._decided:
            return self._propose_new
        return request_id in self._propose_next

    # -- measurements ------------------------------------------------------------------------

    def record_acceptance(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        if num_drafts == 0:
            return
        sample = num_accepted / num_drafts
        # the estimate decays per step, so a probe after a pause weighs more than one sample
        # of a run of verify steps
        since = self.step - self.last_verified.get(request_id, self.step - 1)
        weight = min(1.0 - (1.0 - ACCEPTANCE_DECAY) ** since, max(STALE_WEIGHT, ACCEPTANCE_DECAY))
        self.acceptance[request_id] = _decay(self.acceptance.get(request_id), sample, weight)
        self.last_verified[request_id] = self.step
        self.global_acceptance = _decay(self.global_acceptance, sample, GLOBAL_DECAY)

    def record_step(self, output: SchedulerOutput, elapsed_s: float) -> None:
        """Time one step; only steps of one-token decodes (with or without drafts) count, and a
        plain step counts only when it proposed nothing (its cost is then the decode cost)."""
        requests = output.requests
        if not requests or not all(r.num_tokens == 1 and r.sample for r in requests):
            return
        costs = self.costs.setdefault(batch_bucket(len(requests)), StepCosts())
        num_drafts = sum(len(r.draft_ids) for r in requests)
        if num_drafts:
            costs.verify_s = _decay(costs.verify_s, elapsed_s, COST_DECAY)
            per_request = num_drafts / len(requests)
            costs.drafts_per_request = _decay(costs.drafts_per_request, per_request, COST_DECAY)
        elif not any(r.propose_drafts for r in requests):
            costs.decode_s = _decay(costs.decode_s, elapsed_s, COST_DECAY)

    def forget(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)
        self.last_verified.pop(request_id, None)
