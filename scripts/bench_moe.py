"""MoE against the dense model with the same active parameters, on CPU (issue 24).

A random Mixtral (8 experts, top-2, SmolLM-sized: hidden 576, 30 layers, expert intermediate
768) and a Llama of the same shape with intermediate 2 x 768 (the two active experts' worth),
both saved as HF checkpoints; per model: batch-1 decode tok/s and 16-prompt output tok/s through
pytgi's offline engine (`pytgi.runtime.llm.LLM`), transformers' own `generate` at batch 1 as the
baseline, and for the MoE the bandwidth bound of the expert bytes a 16-row step reads (distinct
experts per layer, expected under uniform routing, times 3 x H x I x 4 bytes) against a measured
copy bandwidth.

    python scripts/bench_moe.py [--quick | --smoke] [--threads 2]

--smoke (2 layers, a few tokens) only checks the script runs; --quick is the reportable short run.
The same models served over HTTP, against llama.cpp on a GGUF of the MoE and against the
transformers fallback: scripts/bench_moe_http.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # fixtures: the tokenizer

import torch  # noqa: E402

SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
EXPERTS, TOP_K, EXPERT_I = 8, 2, 768


def write_models(root: Path, layers: int) -> dict[str, Path]:
    from fixtures.tiny_models import build_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    shape = {**SHAPE, "num_hidden_layers": layers}
    moe = MixtralConfig(
        **shape, intermediate_size=EXPERT_I, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K
    )
    dense = LlamaConfig(**shape, intermediate_size=TOP_K * EXPERT_I)
    configs = {"moe": (MixtralForCausalLM, moe), "dense": (LlamaForCausalLM, dense)}
    out = {}
    for name, (cls, config) in configs.items():
        torch.manual_seed(0)
        model = cls(config)
        path = root / name
        model.save_pretrained(path, safe_serialization=True)
        build_tokenizer(path)
        out[name] = path
    return out


def pytgi_rates(path: Path, new_tokens: int, clients: int) -> dict[str, float]:
    from pytgi.runtime.llm import LLM

    llm = LLM(str(path), block_size=16, num_blocks=256)
    prompt = list(range(10, 42))
    try:
        llm.generate([prompt], max_new_tokens=4, ignore_eos=True)  # warm-up
        start = time.perf_counter()
        llm.generate([prompt], max_new_tokens=new_tokens, ignore_eos=True)
        batch1 = new_tokens / (time.perf_counter() - start)
        prompts = [[t + i for t in prompt] for i in range(clients)]
        start = time.perf_counter()
        llm.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
        batched = clients * new_tokens / (time.perf_counter() - start)
    finally:
        llm.close()
    return {"pytgi_batch1_tok_s": batch1, f"pytgi_{clients}_prompts_tok_s": batched}


def transformers_rate(path: Path, new_tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.arange(10, 42)[None]
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kwargs)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    return new_tokens / (time.perf_counter() - start)


def copy_bandwidth_gb_s() -> float:
    """Read + write bytes per second of a 256 MiB fp32 copy (best of 5)."""
    src = torch.empty(64 << 20)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def expert_bytes_per_step(rows: int, layers: int) -> float:
    """Expected bytes of expert weights one decode step of `rows` rows reads under uniform
    top-k routing: distinct experts per layer E(1 - (1 - k/E)^rows), each 3 x H x I fp32."""
    touched = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** rows)
    return layers * touched * 3 * SHAPE["hidden_size"] * EXPERT_I * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers = 2 if args.smoke else SHAPE["num_hidden_layers"]
    new_tokens = 4 if args.smoke else (32 if args.quick else 128)
    clients = 16
    results = {"layers": layers, "new_tokens": new_tokens, "threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_models(Path(tmp), layers)
        for name, path in paths.items():
            row = pytgi_rates(path, new_tokens, clients)
            row["transformers_batch1_tok_s"] = transformers_rate(path, new_tokens)
            results[name] = row
    bandwidth = copy_bandwidth_gb_s()
    step_bytes = expert_bytes_per_step(clients, layers)
    results["copy_bandwidth_gb_s"] = bandwidth
    results["moe_expert_bytes_per_16_row_step"] = step_bytes
    # upper bound on 16-client output tok/s from expert reads alone
    results["moe_16_rows_expert_bound_tok_s"] = clients * bandwidth * 1e9 / step_bytes
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
