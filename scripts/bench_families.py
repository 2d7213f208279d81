"""Decode throughput of each model family against the Llama of the same size, in one run: the
"Model families" table of docs/PERFORMANCE.md.

    for f in llama phi gemma2; do python scripts/make_family_shaped.py $f /tmp/shaped/$f; done
    python scripts/bench_families.py /tmp/shaped --families phi,gemma2 --rounds 3

Each family's engine is measured right next to the Llama's (the Llama engine stays loaded): per
round, batch 1 then batch 16 (32-token prompts, 64 new tokens, greedy, EOS ignored), Llama and
family alternating, so both see the same load on a shared machine. Reported: decode tok/s (tokens
of decode-only steps / their time) of each, the family / Llama ratio per round (median over
rounds), the same ratio per parameter (x the family's parameter count / the Llama's), and the CPU
share other processes took meanwhile.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

NUM_BLOCKS = 160  # 16 rows x 96 tokens in 16-token blocks, with room to spare
PROMPT_LEN, OUTPUT_LEN = 32, 64


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models_dir", type=Path, help="one subdirectory per family (llama too)")
    parser.add_argument("--families", required=True, help="comma-separated, e.g. phi,gemma2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    return parser.parse_args()


def load_engine(model_dir: Path, threads: int):
    from pytgi.engine.engine_core import EngineCore
    from pytgi.engine.llm import engine_config

    config = engine_config(
        str(model_dir), num_threads=threads, num_blocks=NUM_BLOCKS, max_batch_prefill_tokens=512
    )
    return EngineCore.from_config(config)


def num_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118
    return total


def decode_rate(core, workload, vocab_size: int, seed: str) -> tuple[float, float]:
    """(decode tok/s, others' CPU share) of one run of `workload`."""
    from pytgi.benchmark.engine.pytgi_runner import PytgiRunner
    from pytgi.benchmark.engine.workloads import random_prompts

    trace = PytgiRunner(core).run(workload, random_prompts(workload, vocab_size, seed))
    trace.check_complete()
    return trace.num_decode_tokens / trace.decode_time_s, trace.others or 0.0


def measure(engines: dict, workloads, vocab: dict, rounds: int) -> dict:
    """{workload: {name: [(tok/s, others) per round]}}, the engines alternating within a round."""
    results = {w.name: {name: [] for name in engines} for w in workloads}
    for name, core in engines.items():  # warm-up: kernels, allocator, branch predictors
        decode_rate(core, workloads[0], vocab[name], "warm-up")
    for r in range(rounds):
        for workload in workloads:
            for name, core in engines.items():
                rate = decode_rate(core, workload, vocab[name], f"{workload.name}-{r}")
                results[workload.name][name].append(rate)
    return results


def main() -> None:
    args = parse_args()
    import torch

    from pytgi.benchmark.engine.workloads import sweep_workloads

    torch.set_num_threads(args.num_threads)
    workloads = sweep_workloads([1, 16], [PROMPT_LEN], [OUTPUT_LEN])
    llama_dir = args.models_dir / "llama"
    llama = load_engine(llama_dir, args.num_threads)
    vocab = {"llama": json.loads((llama_dir / "config.json").read_text())["vocab_size"]}
    params = {"llama": num_params(llama_dir)}
    report = {"rounds": args.rounds, "threads": args.num_threads, "families": {}}
    for family in args.families.split(","):
        start_s = time.perf_counter()
        model_dir = args.models_dir / family
        vocab[family] = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        params[family] = num_params(model_dir)
        core = load_engine(model_dir, args.num_threads)
        try:
            results = measure({"llama": llama, family: core}, workloads, vocab, args.rounds)
        finally:
            core.shutdown()
        row = {"params": params[family], "llama_params": params["llama"]}
        for name, runs in results.items():
            ratios = [f[0] / ll[0] for f, ll in zip(runs[family], runs["llama"], strict=True)]
            ratio = statistics.median(ratios)
            row[name] = {
                "tok_s": statistics.median(r[0] for r in runs[family]),
                "llama_tok_s": statistics.median(r[0] for r in runs["llama"]),
                "ratio": ratio,
                "ratio_per_param": ratio * params[family] / params["llama"],
                "others": statistics.mean(r[1] for r in runs[family] + runs["llama"]),
            }
        report["families"][family] = row
        b1, b16 = row[workloads[0].name], row[workloads[1].name]
        print(
            f"{family}: {params[family] / 1e6:.1f} M | batch 1 {b1['tok_s']:.1f} tok/s vs "
            f"{b1['llama_tok_s']:.1f} ({b1['ratio']:.2f}x, per param {b1['ratio_per_param']:.2f}x)"
            f" | batch 16 {b16['tok_s']:.1f} vs {b16['llama_tok_s']:.1f} ({b16['ratio']:.2f}x, "
            f"per param {b16['ratio_per_param']:.2f}x) | others {b1['others']:.2f}/"
            f"{b16['others']:.2f} | {time.perf_counter() - start_s:.0f} s",
            flush=True,
        )
    llama.shutdown()
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
