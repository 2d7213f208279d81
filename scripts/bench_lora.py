"""16-client output throughput with four LoRA adapters mixed, against the base model alone.

    python scripts/bench_lora.py --quick     # the lead's quiet-window run (~6 min, estimated)
    python scripts/bench_lora.py             # the full run (3 rounds, more requests)
    python scripts/bench_lora.py --smoke     # a couple of minutes: checks that it all runs

The base model is SmolLM2-135M-Instruct in float32 (tests/fixtures/smollm2.py smollm2_hf_dir).
Four adapters are made once with PEFT on it (--adapters-dir): random LoRA weights of rank 8, 12,
16 and 8 on every attention and MLP projection (q/k/v/o, gate/up/down). Systems, each a
`pytgi serve --num-threads 2` started by this script: `base` (no adapters) and `lora4`
(`--lora-adapters` the four, requests cycling over them by the chat API's `model` field, so
every batch mixes adapters). Workload: 16 clients of greedy `/v1/chat/completions` on the
prompts of scripts/speculator_prompts.py; output tok/s. Rounds alternate the order; other
processes' CPU is recorded per measurement (bench_issue22's OthersMeter), flagged above 0.1 core.
"""

from __future__ import annotations

import argparse
import atexit
import json
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

from bench_issue22 import _cleanup, _on_signal  # noqa: E402
from bench_speculators import PLANS, Plan, cycle, load, report, run_rounds  # noqa: E402

RANKS = {"lora-r8": 8, "lora-r12": 12, "lora-r16": 16, "lora-r8b": 8}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adapters(base: Path, directory: Path) -> dict[str, Path]:
    """The four PEFT adapters, made once (seeded)."""
    from fixtures.lora_adapters import make_adapter

    out = {}
    for i, (name, rank) in enumerate(RANKS.items()):
        path = directory / name
        if not (path / "adapter_config.json").is_file():
            make_adapter(base, path, seed=i, r=rank, lora_alpha=2 * rank, target_modules=TARGETS)
        out[name] = path
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--adapters-dir", type=Path,
                        default=Path.home() / ".cache/pytgi-bench/smollm2-lora")  # fmt: skip
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    name = "quick" if args.quick else "smoke" if args.smoke else "full"
    plan = PLANS[name]
    if args.rounds:
        plan = Plan(args.rounds, plan.max_tokens, plan.single, plan.batch, plan.clients)
    from fixtures.smollm2 import smollm2_hf_dir
    from speculator_prompts import chat_prompts, code_prompts

    base = smollm2_hf_dir()
    made = adapters(base, args.adapters_dir)
    out = args.out or ROOT / "bench-results" / time.strftime("lora-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    spec = ",".join(f"{n}={p}" for n, p in made.items())
    systems = {"base": ["--model-id", str(base)],
               "lora4": ["--model-id", str(base), "--lora-adapters", spec]}  # fmt: skip
    prompts = cycle(chat_prompts() + code_prompts(), plan.batch)
    key = f"clients{plan.clients}"
    workloads = {
        key: (lambda url: load(url, prompts, plan.clients, plan.max_tokens), {"base"}),
        key + "-mixed": (
            lambda url: load(url, prompts, plan.clients, plan.max_tokens, tuple(made)),
            {"lora4"},
        ),
    }
    results = {
        "format": "pytgi-lora-bench/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan_name": name,
        "plan": asdict(plan),
        "adapters": {n: str(p) for n, p in made.items()},
        "command": [sys.executable, *sys.argv],
    }
    start = time.monotonic()
    results["systems"] = run_rounds(systems, workloads, plan, out, args.threads)
    results["wall_s"] = time.monotonic() - start
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results, "Four LoRA adapters mixed vs the base model (SmolLM2-135M float32)",
                  list(workloads))  # fmt: skip
    (out / "report.md").write_text(text)
    print(text)
    print(f"done in {results['wall_s']:.0f} s: {out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
