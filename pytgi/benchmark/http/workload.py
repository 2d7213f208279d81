"""What to send: named profiles of prompt/output lengths, and the prompts themselves.

Prompts are either synthesised to an exact token count with the benchmark's tokenizer (random
words, different for every request so a prefix cache cannot turn the run into cache hits) or read
from a prompts file. Every step draws its requests from `random.Random(f"{seed}:{step_index}")`,
so the same flags give the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

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


class Workload:
    """Builds the requests of each benchmark step."""

    def __init__(self, config: WorkloadConfig, tokenizer: TextTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self._prompt_lengths = config.prompt_lengths
        self._output_lengths = config.output_lengths
        self._file_prompts: list[FilePrompt] = []
        if config.prompts_file is not None:
            self._file_prompts = read_prompts_file(config.prompts_file, tokenizer)

    def build_specs(self, num_requests: int, step_index: int) -> list[RequestSpec]:
        rng = random.Random(f"{self.config.seed}:{step_index}")
        if self._file_prompts:
            return self._from_file(rng, num_requests)
        style = PROFILES[self.config.profile].text_style
        return [self._synthesize(rng, style) for _ in range(num_requests)]

    def _synthesize(self, rng: random.Random, style: str) -> RequestSpec:
        num_tokens = self._prompt_lengths.sample(rng)
        prompt, num_prompt_tokens = synthesize_prompt(self.tokenizer, rng, num_tokens, style)
        return RequestSpec(prompt, num_prompt_tokens, self._output_lengths.sample(rng))

    def _from_file(self, rng: random.Random, num_requests: int) -> list[RequestSpec]:
        specs: list[RequestSpec] = []
        while len(specs) < num_requests:  # cycle through the file, reshuffled on every pass
            items = list(self._file_prompts)
            rng.shuffle(items)
            for item in items[: num_requests - len(specs)]:
                max_new_tokens = item.output_tokens or self._output_lengths.sample(rng)
                specs.append(RequestSpec(item.text, item.num_tokens, max_new_tokens))
        return specs
