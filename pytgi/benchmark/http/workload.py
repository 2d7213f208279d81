"""What to send: named profiles of prompt/output lengths, and the prompts themselves.

Prompts are either synthesised to an exact token count with the benchmark's tokenizer (random
words, different for every request so a prefix cache cannot turn the run into cache hits) or read
from a prompts file. Every step draws its requests from `random.Random(f"{seed}:{step_index}")`,
so the same flags give the same workload.

Given the server's limits (`ServerLimits`, from a TGI-style `/info`), every request is kept inside
them: prompt lengths are capped below `max_input_tokens` and `max_new_tokens` below what the
context has left, with a margin for the chat template and a tokenizer that counts differently
from the server's; file prompts that cannot fit are skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pytgi.benchmark.http.client import ServerLimits
from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.lengths import LengthDistribution, parse_length_spec
from pytgi.benchmark.http.prompts import FilePrompt, read_prompts_file, synthesize_prompt
from pytgi.benchmark.http.records import RequestSpec
from pytgi.benchmark.http.tokenizer import TextTokenizer


@dataclass(frozen=True)
class Profile:
    name: str
    prompt_tokens: str  # length specs, see `lengths`
    output_tokens: str
    text_style: str  # "prose" | "code"
    summary: str


PROFILES = {
    p.name: p
    for p in (
        Profile("chat", "lognormal:256,0.7,16,2048", "lognormal:128,0.5,16,512", "prose",
                "conversational turns: medium prompts, medium answers"),
        Profile("code", "lognormal:1024,0.5,128,4096", "normal:192,64,32,512", "code",
                "code completion: long context, medium completions"),
        Profile("classification", "lognormal:512,0.6,64,4096", "uniform:1,8", "prose",
                "long inputs, a few output tokens (prefill-bound)"),
        Profile("fixed", "128", "128", "prose", "every request 128 prompt and 128 output tokens"),
    )
}  # fmt: skip


@dataclass(frozen=True)
class WorkloadConfig:
    profile: str = "chat"
    prompt_tokens: str | None = None  # overrides the profile's spec
    output_tokens: str | None = None
    prompts_file: Path | None = None
    seed: int = 0

    def __post_init__(self):
        if self.profile not in PROFILES:
            raise BenchConfigError(f"unknown profile '{self.profile}'; use one of {list(PROFILES)}")
        for spec in (self.prompt_tokens, self.output_tokens):
            if spec is not None:
                parse_length_spec(spec)  # a typo fails here, before any request

    @property
    def prompt_lengths(self) -> LengthDistribution:
        return parse_length_spec(self.prompt_tokens or PROFILES[self.profile].prompt_tokens)

    @property
    def output_lengths(self) -> LengthDistribution:
        return parse_length_spec(self.output_tokens or PROFILES[self.profile].output_tokens)


def limit_margin(limits: ServerLimits) -> int:
    """Tokens kept free of the server's limits: a chat template's wrapping and the difference
    between the benchmark's tokenizer and the server's."""
    return max(16, limits.max_input_tokens // 20)


class Workload:
    """Builds the requests of each benchmark step (inside `limits` when given)."""

    def __init__(
        self, config: WorkloadConfig, tokenizer: TextTokenizer, limits: ServerLimits | None = None
    ):
        self.config = config
        self.tokenizer = tokenizer
        self.limits = limits
        self._prompt_lengths = config.prompt_lengths
        self._output_lengths = config.output_lengths
        self._file_prompts: list[FilePrompt] = []
        if config.prompts_file is not None:
            self._file_prompts = self._fitting(read_prompts_file(config.prompts_file, tokenizer))

    def _fitting(self, prompts: list[FilePrompt]) -> list[FilePrompt]:
        if self.limits is None:
            return prompts
        fitting = [p for p in prompts if p.num_tokens <= self._max_prompt_tokens()]
        if not fitting:
            raise BenchConfigError(
                f"no prompt of the prompts file fits the server's {self.limits.max_input_tokens}"
                " input tokens"
            )
        return fitting

    def _max_prompt_tokens(self) -> int:
        assert self.limits is not None
        return max(1, self.limits.max_input_tokens - limit_margin(self.limits))

    def _fit_output(self, num_prompt_tokens: int, max_new_tokens: int) -> int:
        if self.limits is None:
            return max_new_tokens
        room = self.limits.max_total_tokens - num_prompt_tokens - limit_margin(self.limits)
        return max(1, min(max_new_tokens, room))

    def build_specs(self, num_requests: int, step_index: int) -> list[RequestSpec]:
        rng = random.Random(f"{self.config.seed}:{step_index}")
        if self._file_prompts:
            return self._from_file(rng, num_requests)
        style = PROFILES[self.config.profile].text_style
        return [self._synthesize(rng, style) for _ in range(num_requests)]

    def _synthesize(self, rng: random.Random, style: str) -> RequestSpec:
        num_tokens = self._prompt_lengths.sample(rng)
        if self.limits is not None:
            num_tokens = min(num_tokens, self._max_prompt_tokens())
        prompt, num_prompt_tokens = synthesize_prompt(self.tokenizer, rng, num_tokens, style)
        max_new_tokens = self._fit_output(num_prompt_tokens, self._output_lengths.sample(rng))
        return RequestSpec(prompt, num_prompt_tokens, max_new_tokens)

    def _from_file(self, rng: random.Random, num_requests: int) -> list[RequestSpec]:
        specs: list[RequestSpec] = []
        while len(specs) < num_requests:  # cycle through the file, reshuffled on every pass
            items = list(self._file_prompts)
            rng.shuffle(items)
            for item in items[: num_requests - len(specs)]:
                max_new_tokens = item.output_tokens or self._output_lengths.sample(rng)
                max_new_tokens = self._fit_output(item.num_tokens, max_new_tokens)
                specs.append(RequestSpec(item.text, item.num_tokens, max_new_tokens))
        return specs
