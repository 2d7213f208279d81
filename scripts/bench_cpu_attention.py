"""Time causal prefill attention of one fresh prompt on CPU, fp32: pytgi's compiled
`prefill_attention` against `F.scaled_dot_product_attention(is_causal=True)` (torch's flash CPU
kernel), on SmolLM-135M's attention shape (9 query heads, 3 KV heads, head_dim 64) for one layer.
Prints a Markdown table (docs/PERFORMANCE.md, "Kernel choices"): ms per call (median) and the
causal FLOP rate (4 · T² / 2 · head_dim · heads FLOP).

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_cpu_attention.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from pytgi.backends.cpu.kernels import load_cpu_kernels

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
LENGTHS = (128, 512, 2048)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = load_cpu_kernels()
    if ops is None:
        raise SystemExit("the CPU kernels did not build (see the log)")
    print("| prompt tokens | SDPA ms | pytgi ms | SDPA GFLOP/s | pytgi GFLOP/s | SDPA / pytgi |")
    print("|---|---|---|---|---|---|")
    scale = HEAD_DIM**-0.5
    for tokens in LENGTHS:
        qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM)  # the model's strided views
        q, k, v = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]
        heads_first = [x.transpose(0, 1).unsqueeze(0) for x in (q, k, v)]  # [1, heads, T, D]

        def sdpa(heads_first=heads_first):
            F.scaled_dot_product_attention(
                *heads_first, is_causal=True, scale=scale, enable_gqa=True
            )

        def ours(q=q, k=k, v=v):
            ops.prefill_attention(q, k, v, scale, 0)

        flop = 4 * tokens * tokens / 2 * HEAD_DIM * HEADS
        base, mine = median_ms(sdpa, args.repeats), median_ms(ours, args.repeats)
        print(
            f"| {tokens} | {base:.2f} | {mine:.2f} | {flop / base / 1e6:.1f} | "
            f"{flop / mine / 1e6:.1f} | {base / mine:.2f}× |"
        )


if __name__ == "__main__":
    main()
