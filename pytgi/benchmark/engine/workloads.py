"""What the engine benchmark runs: workloads of requests with fixed prompt and output lengths.

A workload is a list of `RequestSpec` submitted all at once. The named workloads (`uniform`,
`mixed`, `decode1`) are the issue's reference points; a sweep is the cross product batch size ×
prompt length × output length, one uniform batch per case. Prompts are random token ids drawn
with a fixed seed, and EOS is always ignored, so every request produces exactly `output_len`
tokens.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestSpec:
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class Target:
    """A goal from the issue: `metric` of pytgi ≥ `min_ratio` × the same metric of `baseline`.

    `baseline` is a system name ("hf_static", "hf_sequential") or "roofline" for the measured
    weight-bandwidth fraction of decode.
    """

    metric: str
    baseline: str
    min_ratio: float


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: tuple[RequestSpec, ...]
    targets: tuple[Target, ...] = field(default=())

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def max_total_len(self) -> int:
        return max(r.prompt_len + r.output_len for r in self.requests)


NUM_REQUESTS = 16
MIXED_SEED = 1234  # the mixed workload's lengths never change between runs or machines


def uniform_workload() -> Workload:
    return Workload(
        "uniform",
        f"{NUM_REQUESTS} requests × (256 prompt + 128 output) tokens",
        (RequestSpec(256, 128),) * NUM_REQUESTS,
        (Target("output_tok_s", "hf_static", 1.0),),
    )


def mixed_workload() -> Workload:
    rng = random.Random(MIXED_SEED)
    requests = tuple(
        RequestSpec(rng.randint(64, 512), rng.randint(32, 256)) for _ in range(NUM_REQUESTS)
    )
    return Workload(
        "mixed",
        f"{NUM_REQUESTS} requests, prompts 64–512 and outputs 32–256 tokens (seed {MIXED_SEED})",
        requests,
        (Target("output_tok_s", "hf_static", 1.5), Target("output_tok_s", "hf_sequential", 5.0)),
    )


def decode1_workload(output_len: int = 128) -> Workload:
    return Workload(
        "decode1",
        f"batch 1: 32-token prompt, {output_len} output tokens",
        (RequestSpec(32, output_len),),
        (
            Target("decode_tok_s", "hf_sequential", 1.0),
            Target("decode_bw_fraction", "roofline", 0.7),
        ),
    )


NAMED_WORKLOADS = {
    "uniform": uniform_workload,
    "mixed": mixed_workload,
    "decode1": decode1_workload,
}


def named_workload(name: str) -> Workload:
    if name not in NAMED_WORKLOADS:
        raise ValueError(f"unknown workload '{name}'; choose from {', '.join(NAMED_WORKLOADS)}")
    return NAMED_WORKLOADS[name]()


def sweep_workloads(
    batch_sizes: list[int], prompt_lengths: list[int], output_lengths: list[int]
) -> list[Workload]:
    """One uniform batch per (batch size, prompt length, output length), in that nesting order."""
    cases = itertools.product(batch_sizes, prompt_lengths, output_lengths)
    return [
        Workload(
            f"b{b}_p{p}_o{o}",
            f"batch {b}: {p} prompt + {o} output tokens",
            (RequestSpec(p, o),) * b,
        )
        for b, p, o in cases
    ]


def warmup_workload(workload: Workload, output_len: int = 8) -> Workload:
    """A cheap untimed run that touches the same code paths: up to 2 of the shortest prompts."""
    shortest = min(r.prompt_len for r in workload.requests)
    count = min(2, len(workload.requests))
    return Workload(
        f"{workload.name}-warmup", "warm-up", (RequestSpec(shortest, output_len),) * count
    )


def random_prompts(workload: Workload, vocab_size: int, seed: int | str) -> list[list[int]]:
    """Token-id prompts for every request; a new `seed` per run keeps the prefix cache cold."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(r.prompt_len)] for r in workload.requests]
