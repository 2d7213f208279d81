"""A model-free executor: the next token is a pure function of the request's history, so a request's
output does not depend on batching, chunking, prefix hits or preemption — exactly what the engine
must keep.
"""

from __future__ import annotations

from pytgi.config import CacheInfo
from pytgi.engine.outputs import ModelOutput, SampledToken, SchedulerOutput

VOCAB = 1000


def next_token(history: list[int]) -> int:
    return (sum(history) * 31 + len(history)) % VOCAB


class FakeExecutor:
    def __init__(self, num_blocks: int = 64, block_size: int = 4):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.steps: list[SchedulerOutput] = []
        self.kv: dict[int, int] = {}  # slot -> token written there

    def initialize(self) -> CacheInfo:
        total = self.num_blocks * self.block_size
        return CacheInfo(
            self.num_blocks, self.block_size, total, total - 1, total, 4096, "fp32", "cpu"
        )

    def execute(self, out: SchedulerOutput) -> ModelOutput:
        self.steps.append(out)
        result = ModelOutput()
        for r in out.requests:
            history = r.prompt_ids + r.output_ids
            # the cache must already hold every earlier position (prefix hits included)
            for pos in range(r.start_pos):
                slot = r.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size
                assert self.kv.get(slot) == history[pos], (r.request_id, pos)
            for i, token in enumerate(r.input_ids):
                pos = r.start_pos + i
                slot = r.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size
                self.kv[slot] = token
            if r.prefill_logprobs:
                result.prefill_logprobs[r.request_id] = [
                    float(r.start_pos + i) for i in range(r.num_tokens)
                ]
            if r.sample:
                result.sampled[r.request_id] = SampledToken(next_token(history), -0.5)
        return result

    def shutdown(self) -> None:
        pass
