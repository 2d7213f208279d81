"""The accuracy cost of each `--quantize` method, and of int8 activations, on a real model.

Teacher-forced on held-out text (default: this repository's docs/ARCHITECTURE.md, written after
any public model was trained), pytgi's own model runs the full-precision checkpoint and then each
method with int8 activations and with fp32 activations (PYTGI_QUANT_ACTIVATIONS; int8 where the
method allows it), the LM head
in full precision (the default) or quantized too (--quantize-lm-head). Per run:
the logits' RMS error relative to the fp32 model's RMS, the top-1 agreement with the fp32
model, perplexity on the text and its change. `int8 vs fp32 acts` isolates what activation
quantisation adds on top of the weights' own error.

    python scripts/quant_accuracy.py MODEL_DIR [--tokens 512] [--methods eetq,fp8]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch

from pytgi import envs
from pytgi.backends.selector import select_platform
from pytgi.config import CacheConfig, EngineConfig, ModelConfig
from pytgi.layers.quantization.activations import DEFAULT_ACTIVATIONS, FP32_ONLY
from pytgi.layers.quantization.registry import SUPPORTED_QUANTIZE
from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.worker.model_runner import ModelRunner

BLOCK_SIZE = 16


def teacher_forced_logits(model_dir: Path, ids: list[int], quantize: str | None) -> torch.Tensor:
    """Logits [T, V] of every position of `ids`, one prefill step."""
    config = EngineConfig(
        model=ModelConfig(model_id=str(model_dir), quantize=quantize, **envs.model_fields()),
        cache=CacheConfig(block_size=BLOCK_SIZE),
    )
    runner = ModelRunner(config, select_platform())
    runner.load_model(model_dir)
    num_blocks = -(-len(ids) // BLOCK_SIZE)
    runner.allocate_kv_cache(num_blocks)
    step = SchedulerOutput(
        requests=[
            ScheduledRequest(
                request_id="text",
                start_pos=0,
                num_tokens=len(ids),
                new_block_ids=list(range(num_blocks)),
                sample=True,
            )
        ],
        new_requests=[NewRequestData("text", ids, SamplingParams())],
    )
    with torch.inference_mode():
        runner.states.update(step)
        inputs, _ = runner.input_builder.build(step, runner.states)
        hidden = runner._hidden(inputs)  # [T, hidden]
        return runner.model.compute_logits(hidden).float()  # [T, V]


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    targets = torch.tensor(ids[1:])
    nll = torch.nn.functional.cross_entropy(logits[:-1], targets)
    return math.exp(nll.item())


def compare(name: str, logits, reference, ids, ref_ppl, seconds) -> str:
    diff = logits - reference
    rel_rms = (diff.pow(2).mean().sqrt() / reference.pow(2).mean().sqrt()).item()
    top1 = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
    ppl = perplexity(logits, ids)
    return (
        f"| {name} | {rel_rms:.4f} | {diff.abs().max().item():.3f} | {top1 * 100:.1f} % | "
        f"{ppl:.3f} | {(ppl / ref_ppl - 1) * 100:+.2f} % | {seconds:.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    default_text = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
    parser.add_argument("--text", type=Path, default=default_text)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--methods", default=",".join(SUPPORTED_QUANTIZE))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--quantize-lm-head", action="store_true", help="PYTGI_QUANTIZE_LM_HEAD=1 for every run"
    )
    args = parser.parse_args()
    if args.quantize_lm_head:
        os.environ["PYTGI_QUANTIZE_LM_HEAD"] = "1"
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    ids = tokenizer(args.text.read_text())["input_ids"][: args.tokens]
    start = time.perf_counter()
    reference = teacher_forced_logits(args.model_dir, ids, None)
    ref_ppl = perplexity(reference, ids)
    print(f"{len(ids)} tokens of {args.text.name}; fp32 perplexity {ref_ppl:.3f}\n")
    print("| method | logits rel. RMS err | max abs err | top-1 = fp32 | ppl | Δppl | load+run s |")
    print("|---|---|---|---|---|---|---|")
    print(compare("fp32", reference, reference, ids, ref_ppl, time.perf_counter() - start))
    for method in args.methods.split(","):
        results = {}
        for acts in ("int8", "fp32"):
            if acts == "int8" and method in FP32_ONLY:
                continue  # refused: int8 activations would alter NF4 / FP4's table; no fp8 kernel
            os.environ["PYTGI_QUANT_ACTIVATIONS"] = acts
            start = time.perf_counter()
            results[acts] = teacher_forced_logits(args.model_dir, ids, method)
            default = " (default)" if DEFAULT_ACTIVATIONS[method] == acts else ""
            label = f"{method}, {acts} acts{default}"
            print(
                compare(label, results[acts], reference, ids, ref_ppl, time.perf_counter() - start)
            )
        if len(results) == 2:  # what int8 activations add, against the same weights
            print(compare(f"{method}: int8 vs fp32 acts", results["int8"], results["fp32"], ids,
                          perplexity(results["fp32"], ids), 0.0))  # fmt: skip


if __name__ == "__main__":
    main()
