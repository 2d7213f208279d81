"""The results file: one JSON document per run, which the Markdown report, the plots and
`compare` all read.

Layout: `format`, `name`, `started_at`, `wall_time_s`, `target` (url, api, model, tokenizer),
`settings` (workload, bounds, plan), `slo`, `best_load`, `stop_reason`, and `steps`: each step's
summary (see `stats.StepSummary`), its SLO verdict, and its measured requests (times in ms,
`start_ms` relative to the step's first send).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.records import RequestResult
from pytgi.benchmark.http.sweep import Slo, StepRecord, SweepOutcome

FORMAT = "pytgi-bench-http/1"


@dataclass
class BenchRun:
    name: str
    started_at: str  # ISO 8601, UTC
    wall_time_s: float
    target: dict[str, Any]
    settings: dict[str, Any]
    slo: Slo
    outcome: SweepOutcome = field(default_factory=lambda: SweepOutcome([]))

    def to_dict(self) -> dict[str, Any]:
        mode = self.outcome.steps[0].summary.mode if self.outcome.steps else None
        return {
            "format": FORMAT,
            "name": self.name,
            "started_at": self.started_at,
            "wall_time_s": round(self.wall_time_s, 3),
            "target": self.target,
            "settings": self.settings,
            "slo": asdict(self.slo) if self.slo.is_set else None,
            "best_load": self.outcome.best_load,
            "load_mode": mode,
            "stop_reason": self.outcome.stop_reason,
            "steps": [_step_dict(step) for step in self.outcome.steps],
        }


def _step_dict(step: StepRecord) -> dict[str, Any]:
    t0 = min((r.start_s for r in step.result.results), default=0.0)
    return {
        **step.summary.to_dict(),
        "meets_slo": step.meets_slo,
        "slo_violations": step.slo_violations,
        "requests": [_request_dict(r, t0) for r in step.result.results],
    }


def _request_dict(result: RequestResult, t0: float) -> dict[str, Any]:
    return {
        "start_ms": _ms(result.start_s - t0),
        "ttft_ms": _ms(result.ttft_s),
        "e2e_ms": _ms(result.e2e_s),
        "itl_ms": [_ms(gap) for gap in result.itl_s],
        "output_tokens": result.num_output_tokens,
        "output_tokens_source": result.output_tokens_source,
        "token_events": result.num_token_events,
        "prompt_tokens": result.num_prompt_tokens,
        "server_prompt_tokens": result.server_prompt_tokens,
        "error": result.error,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def write_results(data: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_results(data) + "\n", encoding="utf-8")
    return path


def dumps_results(data: dict[str, Any]) -> str:
    """Indented JSON, except that each request stays on one line (a file stays skimmable)."""
    compact: list[str] = []

    def placeholder(request: dict[str, Any]) -> str:
        compact.append(json.dumps(request, separators=(",", ":")))
        return f"@@request-{len(compact) - 1}@@"

    steps = [
        {**step, "requests": [placeholder(r) for r in step["requests"]]} for step in data["steps"]
    ]
    text = json.dumps({**data, "steps": steps}, indent=1)
    return re.sub(r'"@@request-(\d+)@@"', lambda m: compact[int(m.group(1))], text)


def read_results(path: str | Path) -> dict[str, Any]:
    """Load a results file written by `pytgi bench --url`; raises `BenchConfigError` if it isn't."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchConfigError(f"cannot read results file '{path}': {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BenchConfigError(f"'{path}' is not a pytgi bench results file ({FORMAT})")
    return data
