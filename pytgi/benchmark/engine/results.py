"""The results file (`--output results.json`): everything needed to read or redo the run.

Layout: `format`, `started_at`, `wall_s`, `command`, `config` (the options and workloads),
`machine`, `model` (parameter counts, bytes per decode step), and `cases`: per workload its
requests, the `roofline` measured just before its runs (bandwidth, GEMM), per-system medians
(`summary`), every repeat (`runs`), the pytgi ÷ baseline `ratios` and the `targets`. NaN is
written as null.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from pytgi.benchmark.engine.suite import BenchResult, CaseResult, ratios, target_verdicts

FORMAT = "pytgi-bench-engine/1"


def to_json(result: BenchResult, command: list[str] | None = None) -> dict:
    options = asdict(result.options)
    options["workloads"] = [w.name for w in result.options.workloads]
    footprint = result.footprint
    return _without_nan(
        {
            "format": FORMAT,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.started_at)),
            "wall_s": result.wall_s,
            "command": command,
            "config": options,
            "machine": result.machine,
            "model": {
                **asdict(footprint),
                "num_matmul_params": footprint.num_matmul_params,
                "decode_weight_bytes": footprint.decode_weight_bytes,
                "prefill_flop_per_token": footprint.prefill_flop_per_token,
                "hf_attn_implementation": result.hf_attn_implementation,
            },
            "cases": [_case(case) for case in result.cases],
        }
    )


def write_json(result: BenchResult, path: Path, command: list[str] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result, command), indent=2) + "\n")


def _case(case: CaseResult) -> dict:
    workload = case.workload
    return {
        "workload": workload.name,
        "description": workload.description,
        "requests": [[r.prompt_len, r.output_len] for r in workload.requests],
        "roofline": asdict(case.roofline),
        "summary": {name: asdict(m) for name, m in case.summary.items()},
        "runs": {name: [asdict(m) for m in runs] for name, runs in case.runs.items()},
        "ratios": ratios(case),
        "targets": target_verdicts(case),
    }


def _without_nan(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _without_nan(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(v) for v in value]
    return value
