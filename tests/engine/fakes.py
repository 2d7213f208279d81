"""A model-free executor: the next token is a pure function of the request's history, so a request's
output does not depend on batching, chunking, prefix hits or preemption — exactly what the engine
must keep. It keeps the workers' request state with the real `RequestStates`, so every test of the
engine also checks the step contract's deltas (new requests, new tokens, new blocks, freed ids).
"""

from __future__ import annotations

from pytgi.config import CacheInfo
from pytgi.messages.outputs import ModelOutput, SampledToken, SchedulerOutput
from pytgi.worker.request_states import RequestStates

VOCAB = 1000


def next_token(history: list[int]) -> int:
    return (sum(history) * 31 + len(history)) % VOCAB


class FakeExecutor:
    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 4,
        next_token=next_token,
        kv_groups: tuple[tuple[int | None, int], ...] = (),
    ):
        self.next_token = next_token  # history -> the model's next token
        self.num_blocks = num_blocks
        self.block_size = block_size
        # (window, num_blocks) per KV group (a model mixing windowed and full layers), the first
        # the full group of `num_blocks`; empty: one full group
        self.kv_groups = kv_groups
        self.windows = [w for w, _ in kv_groups] or [None]
        self.group_sizes = [n for _, n in kv_groups] or [num_blocks]
        self.steps: list[SchedulerOutput] = []
        self.group_kv: list[dict[int, int]] = [{} for _ in self.windows]  # slot -> token, per group
        self.kv = self.group_kv[0]
        self.states = RequestStates()

    def initialize(self) -> CacheInfo:
        total = self.num_blocks * self.block_size
        return CacheInfo(
            self.num_blocks, self.block_size, total, total - 1, total, 4096, "fp32", "cpu",
            kv_groups=self.kv_groups,
        )  # fmt: skip

    def execute(self, out: SchedulerOutput, grammar_masks=None) -> ModelOutput:
        self.steps.append(out)
        self.states.update(out)
        result = ModelOutput()
        bs = self.block_size
        for r in out.requests:
            state = self.states[r.request_id]
            history = state.token_ids
            for g, (window, kv) in enumerate(zip(self.windows, self.group_kv, strict=True)):
                table = state.group_table(g)
                assert len(table) == len(state.block_ids), "every group's table is as long"
                assert all(0 <= b < self.group_sizes[g] for b in table), (r.request_id, g)
                # the cache must already hold every earlier position the step's first query
                # reads (prefix hits included): all of them, or its window's
                first = 0 if window is None else max(0, r.start_pos - window + 1)
                for pos in range(first, r.start_pos):
                    slot = table[pos // bs] * bs + pos % bs
                    assert kv.get(slot) == history[pos], (r.request_id, g, pos)
                for i, token in enumerate(state.step_token_ids(r)):
                    pos = r.start_pos + i
                    kv[table[pos // bs] * bs + pos % bs] = token
            if r.prefill_logprobs:
                result.prefill_logprobs[r.request_id] = [
                    float(r.start_pos + i) for i in range(r.num_tokens)
                ]
            if r.sample:
                result.sampled[r.request_id] = self._verify(list(history), r.draft_ids)
        return result

    def _verify(self, history: list[int], drafts: list[int]) -> list[SampledToken]:
        """The model's tokens after the history and each draft, while the drafts agree."""
        tokens = []
        for draft in [*drafts, None]:
            token = self.next_token(history + [t.token_id for t in tokens])
            tokens.append(SampledToken(token, -0.5))
            if token != draft:
                break
        return tokens

    def shutdown(self) -> None:
        pass
