"""Token-length distributions for prompts and outputs, parsed from a short spec string.

Specs: `128` (fixed), `uniform:64,256` (inclusive), `normal:MEAN,STD[,MIN,MAX]` and
`lognormal:MEDIAN,SIGMA[,MIN,MAX]`. Samples are integers clamped to [MIN, MAX] (default [1, inf))
and drawn from the `random.Random` the caller passes, so a seed reproduces a workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pytgi.benchmark.http.errors import BenchConfigError

KINDS = ("fixed", "uniform", "normal", "lognormal")


@dataclass(frozen=True)
class LengthDistribution:
    kind: str
    a: float  # fixed value, uniform low, normal mean, lognormal median
    b: float = 0.0  # uniform high, normal std, lognormal sigma
    min_tokens: int = 1
    max_tokens: int | None = None

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        elif self.kind == "normal":
            value = rng.gauss(self.a, self.b)
        else:
            value = self.a * math.exp(rng.gauss(0.0, self.b))
        return self._clamp(round(value))

    def _clamp(self, value: int) -> int:
        value = max(self.min_tokens, value)
        return value if self.max_tokens is None else min(self.max_tokens, value)

    def describe(self) -> str:
        """The spec string this distribution parses from."""
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)},{int(self.b)}"
        bounds = f",{self.min_tokens},{self.max_tokens}" if self.max_tokens is not None else ""
        return f"{self.kind}:{self.a:g},{self.b:g}{bounds}"


def parse_length_spec(spec: str) -> LengthDistribution:
    """Parse a spec such as `normal:256,64,16,1024`; raises `BenchConfigError` on a bad one."""
    kind, _, rest = spec.partition(":")
    if not rest:
        return _build("fixed", [_number(spec, kind)], spec)
    if kind not in KINDS[1:]:
        raise BenchConfigError(f"unknown length distribution '{kind}' in '{spec}'; use {KINDS}")
    return _build(kind, [_number(spec, part) for part in rest.split(",")], spec)


def _number(spec: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise BenchConfigError(f"bad number '{text}' in length spec '{spec}'") from None


def _build(kind: str, values: list[float], spec: str) -> LengthDistribution:
    expected = {"fixed": (1,), "uniform": (2,), "normal": (2, 4), "lognormal": (2, 4)}[kind]
    if len(values) not in expected:
        raise BenchConfigError(
            f"length spec '{spec}' needs {' or '.join(map(str, expected))} values"
        )
    if any(v < 0 for v in values) or (kind != "normal" and values[0] < 1):
        raise BenchConfigError(f"length spec '{spec}' must be positive")
    if kind == "uniform" and values[1] < values[0]:
        raise BenchConfigError(f"length spec '{spec}': high < low")
    if kind == "fixed":
        return LengthDistribution("fixed", values[0], min_tokens=int(values[0]))
    bounds = values[2:] or [1, None]
    low, high = int(bounds[0]), None if bounds[1] is None else int(bounds[1])
    if high is not None and (high < low or low < 1):
        raise BenchConfigError(f"length spec '{spec}': bounds must satisfy 1 <= MIN <= MAX")
    return LengthDistribution(kind, values[0], values[1], max(1, low), high)
