"""Decode speed over HTTP with trained Medusa heads, a trained MLP speculator, n-gram
speculation and no speculation.

    python scripts/bench_speculators.py --quick   # the lead's quiet-window run (~10 min, estimated)
    python scripts/bench_speculators.py             # the full run (3 rounds, more requests)
    python scripts/bench_speculators.py --smoke     # a couple of minutes: checks that it all runs

Needs the heads of scripts/train_speculator.py (--medusa, default ~/.cache/pytgi-bench/
smollm2-medusa) and, for the `mlp` system, its `--kind mlp` checkpoint (--mlp, default
~/.cache/pytgi-bench/smollm2-mlp; left out with a note when missing); the base model is the
Medusa checkpoint's `base_model_name_or_path` (SmolLM2-135M-Instruct in float32). Systems, each a
`pytgi serve --num-threads 2` started by this script: `base` (no speculation), `ngram`
(`--speculate 3` on the base), `medusa` and `mlp` (`--model-id` the checkpoint, `--speculate` =
its heads), all with the default adaptive speculation policy, and `medusa-always` (TGI's policy:
drafts verified in every step; `--no-always` leaves it out). Workloads, greedy
`/v1/chat/completions` on the held-out prompts of scripts/speculator_prompts.py (never trained
on): `chat1` and `code1` (one client, requests one after another: decode tok/s = completion
tokens / wall time) and `chat16` (16 clients on chat and code prompts: output tok/s; every system
but `ngram`). Rounds alternate the order of the systems.
Each server's `pytgi_speculative_*` counters (drafts, accepted, acceptance rate) and
`pytgi_speculation_steps` (steps the policy drafted / skipped) are kept too.
Every measurement records the CPU other processes used meanwhile (bench_issue22's OthersMeter)
and is flagged above 0.1 core. Writes OUT/results.json and OUT/report.md.
"""

from __future__ import annotations

import argparse
import atexit
import json
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

from bench_issue22 import (  # noqa: E402
    _GROUPS,
    OthersMeter,
    _cleanup,
    _kill_group,
    _on_signal,
    _pytgi_env,
    free_port,
)

OTHERS_FLAG_CORES = 0.1


@dataclass(frozen=True)
class Plan:
    rounds: int
    max_tokens: int
    single: int  # requests per one-client workload
    batch: int  # requests of the 16-client workload
    clients: int = 16


PLANS = {
    "full": Plan(rounds=3, max_tokens=128, single=8, batch=48),
    "quick": Plan(rounds=2, max_tokens=64, single=3, batch=16),
    "smoke": Plan(rounds=1, max_tokens=8, single=1, batch=4, clients=4),
}


@dataclass
class Server:
    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait(timeout=30)


def start_server(args: list[str], log: Path, threads: int, timeout_s: float = 600) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "pytgi", "serve", *args, "--hostname", "127.0.0.1",
           "--port", str(port), "--num-threads", str(threads)]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    print("  $", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=_pytgi_env(),
                                start_new_session=True)  # fmt: skip
    _GROUPS.add(proc.pid)
    server = Server(proc, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _GROUPS.discard(proc.pid)
            raise RuntimeError(f"server exited ({proc.returncode}), see {log}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s, see {log}")


def chat(url: str, prompt: str, max_tokens: int, model: str = "tgi") -> int:
    """One greedy chat completion; its number of completion tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0}  # fmt: skip
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())["usage"]["completion_tokens"]


def load(url: str, prompts: list[str], clients: int, max_tokens: int, models=("tgi",)) -> dict:
    """`clients` concurrent clients over `prompts` (request i on models[i % len]): tok/s."""
    start = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        jobs = [pool.submit(chat, url, p, max_tokens, models[i % len(models)])
                for i, p in enumerate(prompts)]  # fmt: skip
        tokens = sum(j.result() for j in jobs)
    wall = time.monotonic() - start
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "requests": len(prompts)}


def speculation_metrics(url: str) -> dict:
    """The server's `pytgi_speculative_*` counters (drafts, accepted, rate) and the policy's
    drafted / skipped steps over all its work."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as err:
        return {"error": str(err)}
    metrics = {}
    for line in text.splitlines():
        if line.startswith(("pytgi_speculative_", "pytgi_speculation_steps{")):
            key, _, value = line.partition(" ")
            metrics[key] = float(value)
    return metrics


def measured(fn, *args, **kwargs) -> dict:
    with OthersMeter() as meter:
        try:
            result = fn(*args, **kwargs)
        except (RuntimeError, OSError) as err:
            result = {"error": str(err)}
    result["others_cores"] = meter.cores
    result["others_flag"] = meter.cores is not None and meter.cores > OTHERS_FLAG_CORES
    return result


def cycle(prompts: list[str], n: int) -> list[str]:
    return [prompts[i % len(prompts)] for i in range(n)]


def report(results: dict, title: str, workloads: list[str]) -> str:
    lines = [f"# {title}", "", f"Run {results['started_at']}, {results['plan_name']} plan "
             f"({json.dumps(results['plan'])}). Output tok/s per round; ⚠: other processes used "
             f"more than {OTHERS_FLAG_CORES} core.", "",
             "| system | " + " | ".join(workloads) + " |",
             "|---|" + "---|" * len(workloads)]  # fmt: skip
    for system, rounds in results["systems"].items():
        cells = []
        for w in workloads:
            values = []
            for rnd in rounds:
                m = rnd.get(w) or {}
                if "tok_s" in m:
                    values.append(f"{m['tok_s']:.1f}" + (" ⚠" if m.get("others_flag") else ""))
                elif m:
                    values.append("error")
            cells.append(" / ".join(values) or "—")
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_rounds(systems: dict, workloads: dict, plan: Plan, out: Path, threads: int) -> dict:
    """systems: name -> serve args; workloads: name -> (fn(url) -> dict, systems it runs on)."""
    results: dict = {name: [] for name in systems}
    names = list(systems)
    for rnd in range(plan.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            entry: dict = {"round": rnd + 1}
            results[name].append(entry)
            log = out / f"round{rnd + 1}-{name}.log"
            try:
                server = start_server(systems[name], log, threads)
            except RuntimeError as err:
                entry["error"] = str(err)
                continue
            try:
                for wname, (fn, on) in workloads.items():
                    if name in on:
                        entry[wname] = measured(fn, server.url)
                        print(f"  round {rnd + 1} {name} {wname}: {entry[wname]}", flush=True)
                entry["speculation"] = speculation_metrics(server.url)
            finally:
                server.stop()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--medusa", type=Path,
                        default=Path.home() / ".cache/pytgi-bench/smollm2-medusa")  # fmt: skip
    parser.add_argument("--mlp", type=Path,
                        default=Path.home() / ".cache/pytgi-bench/smollm2-mlp")  # fmt: skip
    parser.add_argument("--no-always", action="store_true",
                        help="leave out medusa-always (TGI's speculation policy)")  # fmt: skip
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    name = "quick" if args.quick else "smoke" if args.smoke else "full"
    plan = PLANS[name]
    if args.rounds:
        plan = Plan(args.rounds, plan.max_tokens, plan.single, plan.batch, plan.clients)
    config = args.medusa / "config.json"
    if not config.is_file():
        sys.exit(f"{config} is missing: run scripts/train_speculator.py first")
    base = json.loads(config.read_text())["base_model_name_or_path"]
    from speculator_prompts import chat_prompts, code_prompts, split

    held = split(chat_prompts() + code_prompts())[1]  # the training script's held-out prompts
    chat_held = [p for p in held if p in set(chat_prompts())]
    code_held = [p for p in held if p in set(code_prompts())]
    pairs = zip(chat_held, code_held, strict=False)
    mixed = [p for pair in pairs for p in pair] + chat_held[len(code_held) :]  # chat and code
    out = args.out or ROOT / "bench-results" / time.strftime("speculators-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    systems = {
        "base": ["--model-id", base],
        "ngram": ["--model-id", base, "--speculate", "3"],
        "medusa": ["--model-id", str(args.medusa)],
    }
    if not args.no_always:
        systems["medusa-always"] = systems["medusa"] + ["--speculation-policy", "always"]
    if (args.mlp / "config.json").is_file():
        systems["mlp"] = ["--model-id", str(args.mlp)]
    else:
        print(f"note: no {args.mlp}/config.json, the mlp system is left out "
              "(scripts/train_speculator.py --kind mlp)")  # fmt: skip
    n, t = plan.single, plan.max_tokens
    workloads = {
        "chat1": (lambda url: load(url, cycle(chat_held, n), 1, t), set(systems)),
        "code1": (lambda url: load(url, cycle(code_held, n), 1, t), set(systems)),
        f"chat{plan.clients}": (
            lambda url: load(url, cycle(mixed, plan.batch), plan.clients, t),
            set(systems) - {"ngram"},
        ),
    }
    results = {
        "format": "pytgi-speculators/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan_name": name,
        "plan": asdict(plan),
        "medusa": str(args.medusa),
        "mlp": str(args.mlp) if "mlp" in systems else None,
        "command": [sys.executable, *sys.argv],
    }
    start = time.monotonic()
    results["systems"] = run_rounds(systems, workloads, plan, out, args.threads)
    results["wall_s"] = time.monotonic() - start
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = report(results, "Speculation over HTTP (SmolLM2-135M float32)", list(workloads))
    (out / "report.md").write_text(text)
    print(text)
    print(f"done in {results['wall_s']:.0f} s: {out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
