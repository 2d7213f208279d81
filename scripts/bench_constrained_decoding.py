"""Constrained against free decoding in the same run, through pytgi's engine (EngineCore, its
scheduler, grammar manager, model runner and sampler): the decode step time at batch 1 and 16 for
a JSON schema and a regex, with the grammar's share of each step (token masks filled by the
engine, applied by the sampler, matchers advanced by the scheduler), and the compile time p50/p99
of realistic grammars (scripts/grammar_cases.py) against the model's vocabulary.

    python scripts/make_smollm_shaped.py /tmp/smollm2-shaped --tokenizer-from <SmolLM2 tokenizer>
    nice python scripts/bench_constrained_decoding.py --model-id /tmp/smollm2-shaped

Rounds interleave the modes (free, json, regex) so that a shared machine's load hits all of them
alike. Only steps where every request of the batch decodes one token count; the grammars cannot
end before `--max-new-tokens`, and free requests ignore EOS, so every measured step has the full
batch. Compiles are timed on a fresh compiler per round (no cache), as `CompiledGrammar.compile_s`
(building the grammar and its first mask).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from grammar_cases import REALISTIC  # noqa: E402

# a JSON document that cannot close within the measured tokens (at least 40 records)
RECORDS = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 40,
            "maxItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "city": {"enum": ["Paris", "Berlin", "Madrid", "Rome", "Lisbon"]},
                    "active": {"type": "boolean"},
                    "score": {"type": "number"},
                },
                "required": ["name", "age", "city", "active", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["records"],
    "additionalProperties": False,
}
# log lines, at least 20 of them
LOG_LINES = r"(\d{4}-\d{2}-\d{2} (INFO|WARN|ERROR) [a-z]{3,12}( [a-z0-9]{2,10}){2,8}\.\n){20,60}"
PROMPT = "Write the records of the city's registry, one per line, as requested: "
MODES = ("free", "json", "regex")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-id", required=True, help="model directory (e.g. SmolLM2-shaped)")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--compile-repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    return parser.parse_args()


class StepProbe:
    """Times the grammar's work inside the engine by wrapping the functions that do it: the mask
    fill (on the engine's mask thread, during the forward), the sampler's wait for it (the part
    the forward did not hide), the apply and the matchers' accept; `take()` returns and resets
    the totals (seconds)."""

    def __init__(self, core):
        import pytgi.sampling.sampler as sampler_module
        from pytgi.engine.grammar_manager import MaskFill
        from pytgi.grammar.matcher import GrammarMatcher

        self.totals: dict[str, float] = defaultdict(float)
        manager = core.grammar
        manager.filler.fill_with_drafts = self._timed("fill", manager.filler.fill_with_drafts)
        MaskFill.wait = self._timed("wait", MaskFill.wait)
        sampler_module.apply_grammar = self._timed("apply", sampler_module.apply_grammar)
        GrammarMatcher.accept_token = self._timed("accept", GrammarMatcher.accept_token)

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[name] += time.perf_counter() - start

        return timed

    def take(self) -> dict[str, float]:
        totals, self.totals = dict(self.totals), defaultdict(float)
        return totals


def requests_for(llm, mode: str, batch: int, max_new: int):
    from pytgi.messages.request import EngineRequest
    from pytgi.messages.sampling_params import GrammarSpec, SamplingParams, StoppingParams

    grammar = {
        "free": None,
        "json": GrammarSpec.json_schema(RECORDS),
        "regex": GrammarSpec.regex(LOG_LINES),
    }[mode]
    eos = tuple(llm.tokenizer.eos_token_ids)
    out = []
    for i in range(batch):
        ids = llm.tokenizer.encode(f"{PROMPT}#{i} {uuid.uuid4().hex[:8]}").ids
        stopping = StoppingParams(max_new, eos, ignore_eos_token=grammar is None)
        out.append(EngineRequest(uuid.uuid4().hex, ids, SamplingParams(grammar=grammar), stopping))
    return out


def run_batch(llm, probe: StepProbe, mode: str, batch: int, max_new: int) -> dict[str, list]:
    """Run one batch to its end; per decode step with the full batch: its wall time, the CPU
    time the process spent in it (every thread: the forward, the mask fill on its threads; less
    sensitive than wall time to a shared machine's other work) and the grammar's parts (ms)."""
    core = llm.core
    executor = core.executor
    full_decode = []
    execute = executor.execute

    def execute_and_classify(scheduler_output):
        rows = scheduler_output.requests
        full_decode.append(len(rows) == batch and scheduler_output.num_tokens == batch)
        return execute(scheduler_output)

    executor.execute = execute_and_classify
    for request in requests_for(llm, mode, batch, max_new):
        core.add_request(request)
    record: dict[str, list] = defaultdict(list)
    finished = 0
    try:
        while core.has_unfinished():
            probe.take()
            start, start_cpu = time.perf_counter(), time.process_time()
            outputs = core.step()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            parts = probe.take()
            finished += sum(o.finished for o in outputs)
            if any(o.error for o in outputs):
                raise RuntimeError(next(o.error for o in outputs if o.error))
            if full_decode and full_decode[-1] and finished == 0:
                record["step_ms"].append(elapsed * 1e3)
                record["cpu_ms"].append(cpu * 1e3)
                for name in ("fill", "wait", "apply", "accept"):
                    record[f"{name}_ms"].append(parts.get(name, 0.0) * 1e3)
            full_decode.clear()
    finally:
        executor.execute = execute
    return record


def decode_benchmark(llm, args) -> dict:
    probe = StepProbe(llm.core)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    for batch in batch_sizes:  # warm-up: compiles, lexer states, allocator
        for mode in MODES:
            run_batch(llm, probe, mode, batch, 8)
    steps = {b: {m: defaultdict(list) for m in MODES} for b in batch_sizes}
    ratios = {b: {m: defaultdict(list) for m in MODES} for b in batch_sizes}
    for r in range(args.rounds):
        for batch in batch_sizes:
            order = MODES[r % 3 :] + MODES[: r % 3]
            runs = {mode: run_batch(llm, probe, mode, batch, args.max_new_tokens) for mode in order}
            for mode, run in runs.items():
                for key, values in run.items():
                    steps[batch][mode][key] += values
                for key in ("step_ms", "cpu_ms"):  # paired with the free run of this round
                    base = statistics.median(runs["free"][key])
                    ratios[batch][mode][key].append(statistics.median(run[key]) / base)
            print(f"round {r} batch {batch:2d}: " + ", ".join(
                f"{m} {statistics.median(runs[m]['step_ms']):.1f} ms" for m in MODES
            ), flush=True)  # fmt: skip
    return summarise(steps, ratios)


def summarise(steps: dict, ratios: dict) -> dict:
    """Medians over all measured steps; the overhead is the median over rounds of each round's
    constrained / free ratio (pairs runs that saw the same machine load); `critical_pct` is the
    grammar's work on the step's path (wait for the masks, apply, accept) over the free step."""
    table = {}
    for batch, modes in steps.items():
        free_ms = statistics.median(modes["free"]["step_ms"])
        for mode, record in modes.items():
            critical = sum(statistics.fmean(record[f"{k}_ms"]) for k in ("wait", "apply", "accept"))
            table[f"b{batch}_{mode}"] = {
                "batch": batch,
                "mode": mode,
                "steps": len(record["step_ms"]),
                "step_ms_median": statistics.median(record["step_ms"]),
                "cpu_ms_median": statistics.median(record["cpu_ms"]),
                "overhead_wall_pct": 100.0
                * (statistics.median(ratios[batch][mode]["step_ms"]) - 1),
                "overhead_cpu_pct": 100.0 * (statistics.median(ratios[batch][mode]["cpu_ms"]) - 1),
                "critical_pct": 100.0 * critical / free_ms,
                **{
                    k: statistics.fmean(v)
                    for k, v in record.items()
                    if k not in ("step_ms", "cpu_ms")
                },
            }
    return table


def compile_benchmark(llm, repeats: int) -> dict:
    from pytgi.config import GrammarConfig
    from pytgi.grammar import GrammarCompiler
    from pytgi.messages.sampling_params import GrammarSpec

    vocab = llm.core.grammar.vocab
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        compiler = GrammarCompiler(vocab, GrammarConfig())  # no cache across rounds
        for name, kind, value in REALISTIC:
            spec = GrammarSpec.json_schema(value) if kind == "json" else GrammarSpec.regex(value)
            times[name].append(compiler.compile(spec).compile_s * 1e3)
        compiler.close()
    every = sorted(t for ts in times.values() for t in ts)
    return {
        "cases": len(times),
        "compiles": len(every),
        "p50_ms": every[len(every) // 2],
        "p99_ms": every[min(len(every) - 1, round(0.99 * (len(every) - 1)))],
        "max_ms": every[-1],
        "per_case_median_ms": {k: statistics.median(v) for k, v in times.items()},
    }


def main() -> None:
    args = parse_args()
    from pytgi.runtime.llm import LLM

    load_start = os.getloadavg()
    llm = LLM(args.model_id, num_threads=args.num_threads, max_batch_prefill_tokens=1024)
    vocab_size = llm.core.grammar.vocab.vocab_size
    print(f"model {args.model_id}: vocabulary {vocab_size}, {args.num_threads} thread(s)")
    try:
        decode = decode_benchmark(llm, args)
        compiles = compile_benchmark(llm, args.compile_repeats)
    finally:
        llm.close()
    load_end = os.getloadavg()
    header = "| batch | mode | step ms | CPU ms | vs free: wall, CPU | on the step's path |"
    header += " fill | wait | apply | accept |"
    print(f"\n{header}")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in decode.values():
        cells = [
            row["batch"],
            row["mode"],
            f"{row['step_ms_median']:.1f}",
            f"{row['cpu_ms_median']:.1f}",
            f"{row['overhead_wall_pct']:+.1f} %, {row['overhead_cpu_pct']:+.1f} %",
            f"{row['critical_pct']:.1f} %",
            *(f"{row[k]:.2f}" for k in ("fill_ms", "wait_ms", "apply_ms", "accept_ms")),
        ]
        print("| " + " | ".join(map(str, cells)) + " |")
    print(f"\ncompile ({compiles['compiles']} compiles of {compiles['cases']} grammars): "
          f"p50 {compiles['p50_ms']:.2f} ms, p99 {compiles['p99_ms']:.2f} ms, "
          f"max {compiles['max_ms']:.2f} ms")  # fmt: skip
    print(f"load average: {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end")
    if args.json:
        record = {
            "model": args.model_id,
            "vocab_size": vocab_size,
            "num_threads": args.num_threads,
            "load_average": {"start": load_start, "end": load_end},
            "decode": decode,
            "compile": compiles,
        }
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
