"""`pytgi bench --model-id …`: the engine benchmark's flags and entry point.

The flags share one parser with the HTTP benchmark's: an option the HTTP side already declares
(`--seed`: same name, so the same dest) is read from there rather than
declared twice. Nothing here imports torch until the run starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytgi.benchmark.engine.workloads import NAMED_WORKLOADS, named_workload, sweep_workloads

HF_BASELINES = ("hf_sequential", "hf_static")
# pytgi_transformers: pytgi itself through the transformers fallback (its cost against native)
BASELINE_NAMES = (*HF_BASELINES, "pytgi_transformers")


def _int_list(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got '{value}'"
        ) from None
    if not numbers or min(numbers) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{value}'")
    return numbers


def _name_list(choices: tuple[str, ...]):
    def parse(value: str) -> list[str]:
        names = [v.strip() for v in value.split(",") if v.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}"
            )
        return names

    return parse


ENGINE_OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--model-id", {"help": "engine benchmark: local checkpoint directory or hub id"}),
    ("--dtype", {"default": "float32", "choices": ("float32", "bfloat16", "float16"),
                 "help": "compute dtype of pytgi and the transformers baseline"}),
    ("--workload", {"type": _name_list(tuple(NAMED_WORKLOADS)),
                    "help": "named workloads, comma-separated: uniform (16 × 256+128), mixed "
                            "(16, prompts 64-512, outputs 32-256), decode1 (batch 1, 32-token "
                            "prompt); default: all three unless a sweep is given"}),
    ("--batch-sizes", {"type": _int_list, "help": "sweep: batch sizes, e.g. 1,4,16"}),
    ("--prompt-lengths", {"type": _int_list, "help": "sweep: prompt lengths (default 128)"}),
    ("--output-lengths", {"type": _int_list, "help": "sweep: output lengths (default 128)"}),
    ("--warmup", {"type": int, "default": 1, "help": "untimed warm-up runs per workload"}),
    ("--repeats", {"type": int, "default": 1, "help": "timed runs per workload (medians)"}),
    ("--seed", {"type": int, "default": 0, "help": "seed of the random prompts"}),
    ("--num-threads", {"type": int, "help": "torch threads for both engines (default: torch's)"}),
    ("--no-baseline", {"action": "store_true", "help": "skip transformers generate"}),
    ("--baselines", {"type": _name_list(BASELINE_NAMES), "default": list(HF_BASELINES),
                     "help": "the runs pytgi is compared with: hf_sequential,hf_static "
                             "(transformers generate), pytgi_transformers (pytgi through its "
                             "transformers fallback)"}),
    ("--sequential-sample", {"type": int, "default": 4,
                             "help": "hf_sequential on identical requests: run this many, replay "
                                     "their timings for the rest (0: run all)"}),
    ("--max-batch-prefill-tokens", {"type": int, "help": "pytgi: token budget of one step"}),
    ("--max-batch-size", {"type": int, "help": "pytgi: maximum running requests"}),
    ("--model-implementation", {"default": "auto", "choices": ("auto", "transformers"),
                                "help": "pytgi: transformers forces the transformers fallback"}),
    ("--quantize", {"help": "pytgi: quantize the checkpoint as `serve --quantize` does (the "
                            "transformers baselines stay in --dtype)"}),
    ("--quantize-activations", {"choices": ("int8", "fp32"),
                                "help": "pytgi: the quantized layers' activations (default: "
                                        "the method's own, as `serve`)"}),
    ("--output", {"type": Path, "help": "write the results as JSON to this file"}),
    ("--markdown", {"type": Path, "help": "write a Markdown summary to this file"}),
)  # fmt: skip


def add_engine_bench_args(
    parser: argparse.ArgumentParser, declared: frozenset[str] = frozenset()
) -> None:
    """Adds the engine options except those in `declared` (flags the parser already has, whose
    values the engine reads under the same dest)."""
    group = parser.add_argument_group("engine benchmark (--model-id)")
    for name, kwargs in ENGINE_OPTIONS:
        if name not in declared:
            group.add_argument(name, **kwargs)


def engine_value(args: argparse.Namespace, name: str):
    """The value of engine option `name` (its dest: the flag without dashes, `-` as `_`)."""
    return getattr(args, name, None)


def bench_options(args: argparse.Namespace):
    """Parsed flags → `BenchOptions`; raises ValueError with a user-facing message."""
    from pytgi.benchmark.engine.suite import BenchOptions

    def value(name: str):
        return engine_value(args, name)

    for name, minimum in (("warmup", 0), ("repeats", 1), ("sequential_sample", 0)):
        if value(name) is None or value(name) < minimum:
            raise ValueError(f"--{name} must be >= {minimum}")
    return BenchOptions(
        model_id=value("model_id"),
        workloads=tuple(select_workloads(args)),
        dtype=value("dtype") or "float32",
        num_threads=value("num_threads"),
        baselines=() if value("no_baseline") else tuple(value("baselines") or ()),
        warmup=value("warmup"),
        repeats=value("repeats"),
        seed=value("seed") or 0,
        sequential_sample=value("sequential_sample"),
        max_batch_prefill_tokens=value("max_batch_prefill_tokens"),
        max_batch_size=value("max_batch_size"),
        model_implementation=value("model_implementation") or "auto",
        quantize=value("quantize"),
        quantize_activations=value("quantize_activations"),
    )


def select_workloads(args: argparse.Namespace) -> list:
    sweep = [engine_value(args, n) for n in ("batch_sizes", "prompt_lengths", "output_lengths")]
    names = engine_value(args, "workload")
    workloads = []
    if any(sweep):
        batch_sizes, prompt_lengths, output_lengths = sweep
        workloads += sweep_workloads(
            batch_sizes or [1], prompt_lengths or [128], output_lengths or [128]
        )
    if names or not workloads:
        workloads += [named_workload(n) for n in names or NAMED_WORKLOADS]
    return workloads


def run_engine_bench(args: argparse.Namespace) -> int:
    try:
        options = bench_options(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from pytgi import envs
    from pytgi.benchmark.engine.report import markdown_report, text_report
    from pytgi.benchmark.engine.results import write_json
    from pytgi.benchmark.engine.suite import run_suite
    from pytgi.errors import PytgiError

    try:
        result = run_suite(options, omp_wait_policy=envs.get("OMP_WAIT_POLICY"))
    except (PytgiError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text_report(result))
    output, markdown = engine_value(args, "output"), engine_value(args, "markdown")
    if output:
        write_json(result, Path(output), command=sys.argv)
        print(f"results: {output}", file=sys.stderr)
    if markdown:
        Path(markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown).write_text(markdown_report(result))
        print(f"markdown: {markdown}", file=sys.stderr)
    return 0
