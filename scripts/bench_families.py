"""Decode throughput of each model family against the Llama of the same size, in one run: the
"Model families" table of docs/PERFORMANCE.md.

    for f in llama phi gemma2; do python scripts/make_family_shaped.py $f /tmp/shaped/$f; done
    python scripts/bench_families.py /tmp/shaped --families phi,gemma2 --rounds 2

Each family's engine is measured right next to the Llama's (the Llama engine stays loaded): per
round, batch 1 then batch 16 (32-token prompts, 64 new tokens, greedy, EOS ignored), Llama and
family alternating, so both see the same load on a shared machine. Two figures per workload:

- wall: decode tok/s (tokens of decode-only steps / their wall time) with --num-threads threads,
  what a user sees; on a machine other processes share, it moves with their load;
- cpu: the same tokens / the process's CPU time in those steps with one thread, which a
  descheduled process does not accumulate: the steadier measure of the work per token.

Reported: the family's and the Llama's medians over rounds, the family / Llama ratio (median of
the per-round ratios), the ratio per parameter (x the family's parameter count / the Llama's), the
ratio per streamed parameter (the same with the parameters a decode step reads in full:
`streamed_params`), the CPU share other processes took meanwhile, and the load average.
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
    from pytgi.runtime.build import build_engine_core, engine_config

    config = engine_config(
        str(model_dir), num_threads=threads, num_blocks=NUM_BLOCKS, max_batch_prefill_tokens=512
    )
    return build_engine_core(config)


def num_params(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118
    return total


INPUT_TABLES = ("embed_tokens.", "wte.", "word_embeddings.", "wpe.")  # gathered, not streamed


def streamed_params(model_dir: Path) -> int:
    """Parameters a decode step reads in full: all but the input embedding (unless the LM head
    shares it) and learned positions, of which a step gathers a few rows."""
    from safetensors import safe_open

    sizes = {}
    for path in model_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            sizes |= {name: math.prod(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
    untied = "lm_head.weight" in sizes
    return sum(
        size
        for name, size in sizes.items()
        if not (any(t in name for t in INPUT_TABLES) and (untied or "wpe." in name))
    )


def decode_rates(core, workload, vocab_size: int, seed: str) -> tuple[float, float, float]:
    """(decode tokens per wall second, per CPU second, others' CPU share) of one run."""
    from pytgi.benchmark.engine import contention
    from pytgi.benchmark.engine.workloads import random_prompts
    from pytgi.messages.request import EngineRequest
    from pytgi.messages.sampling_params import SamplingParams, StoppingParams

    prompts = random_prompts(workload, vocab_size, seed)
    for i, (spec, ids) in enumerate(zip(workload.requests, prompts, strict=True)):
        stopping = StoppingParams(max_new_tokens=spec.output_len, ignore_eos_token=True)
        core.add_request(EngineRequest(f"{seed}-{i}", ids, SamplingParams(), stopping))
    tokens, wall_s, cpu_s = 0, 0.0, 0.0
    before, cpu_start = core.stats(), contention.snapshot()
    while core.has_unfinished():
        wall, cpu = time.perf_counter(), time.process_time()
        core.step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = core.stats()
        if after.num_prefill_tokens == before.num_prefill_tokens:  # a decode-only step
            tokens += after.num_decode_tokens - before.num_decode_tokens
            wall_s, cpu_s = wall_s + wall, cpu_s + cpu
        before = after
    others = contention.others_fraction(cpu_start, contention.snapshot()) or 0.0
    return tokens / wall_s, tokens / cpu_s, others


def measure(engines: dict, workloads, vocab: dict, rounds: int, threads: int) -> dict:
    """{workload: {name: [(wall tok/s, cpu tok/s, others) per round]}}, the engines alternating
    within a round; wall with `threads` threads, cpu with one."""
    import torch

    results = {w.name: {name: [] for name in engines} for w in workloads}
    for name, core in engines.items():  # warm-up: kernels, allocator, branch predictors
        decode_rates(core, workloads[0], vocab[name], f"warm-up-{name}")
    for r in range(rounds):
        for workload in workloads:
            for name, core in engines.items():
                torch.set_num_threads(threads)
                wall, _, others = decode_rates(core, workload, vocab[name], f"{workload.name}-{r}")
                torch.set_num_threads(1)
                _, cpu, _ = decode_rates(core, workload, vocab[name], f"{workload.name}-{r}-1t")
                results[workload.name][name].append((wall, cpu, others))
    torch.set_num_threads(threads)
    return results


def summarize(runs: dict, family: str, ratio_params: float, ratio_streamed: float) -> dict:
    """Medians and ratios of one workload's rounds (see the module docstring)."""
    row = {}
    for i, figure in enumerate(("wall", "cpu")):
        ours, llama = [r[i] for r in runs[family]], [r[i] for r in runs["llama"]]
        ratio = statistics.median(f / ll for f, ll in zip(ours, llama, strict=True))
        row[figure] = {
            "tok_s": statistics.median(ours),
            "llama_tok_s": statistics.median(llama),
            "ratio": ratio,
            "ratio_per_param": ratio * ratio_params,
            "ratio_per_streamed_param": ratio * ratio_streamed,
        }
    row["others"] = statistics.mean(r[2] for r in runs[family] + runs["llama"])
    return row


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
            engines = {"llama": llama, family: core}
            results = measure(engines, workloads, vocab, args.rounds, args.num_threads)
        finally:
            core.shutdown()
        row = {
            "params": params[family],
            "llama_params": params["llama"],
            "streamed_params": streamed_params(model_dir),
            "llama_streamed_params": streamed_params(llama_dir),
            "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        }
        ratio_params = params[family] / params["llama"]
        ratio_streamed = row["streamed_params"] / row["llama_streamed_params"]
        for name, runs in results.items():
            row[name] = summarize(runs, family, ratio_params, ratio_streamed)
        report["families"][family] = row
        print(f"{family}: {params[family] / 1e6:.1f} M", end="")
        for workload in workloads:
            r = row[workload.name]
            print(
                f" | {workload.name}: wall {r['wall']['tok_s']:.1f} vs "
                f"{r['wall']['llama_tok_s']:.1f} tok/s ({r['wall']['ratio_per_param']:.2f}x per "
                f"param), cpu {r['cpu']['tok_s']:.1f} vs {r['cpu']['llama_tok_s']:.1f} "
                f"({r['cpu']['ratio_per_param']:.2f}x, "
                f"{r['cpu']['ratio_per_streamed_param']:.2f}x streamed), others {r['others']:.2f}",
                end="",
            )
        print(f" | {time.perf_counter() - start_s:.0f} s", flush=True)
        if args.output:  # after every family: a run cut short keeps what it measured
            args.output.write_text(json.dumps(report, indent=2))
    llama.shutdown()


if __name__ == "__main__":
    main()
