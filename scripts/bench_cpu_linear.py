"""Time the CPU fp32 linear layouts pytgi chooses between, on SmolLM-135M's layer shapes.

For each shape and row count M: `F.linear` on the checkpoint's row-major weight, the same call on
a column-major weight, and the compiled `linear_packed` kernel on 16-column tiles (µs per call,
median). Weights are rotated through >= 256 MB of copies so every call streams them from DRAM, as
a forward pass does. Prints a Markdown table (docs/PERFORMANCE.md, "Kernel choices").

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_cpu_linear.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from pytgi.backends.cpu.kernels import load_cpu_kernels
from pytgi.layers.quantization.unquantized import pack_column_tiles

SHAPES = {  # name: (out N, in K)
    "qkv 960×576": (960, 576),
    "o 576×576": (576, 576),
    "gate_up 3072×576": (3072, 576),
    "down 576×1536": (576, 1536),
    "LM head 49152×576": (49152, 576),
}
ROWS = (1, 2, 6, 16, 64, 256)


def median_us(fn, weights, repeats: int) -> float:
    for w in weights[:2]:
        fn(w)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            fn(w)
        times.append((time.perf_counter() - start) / len(weights))
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rotation-mb", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = load_cpu_kernels()
    if ops is None:
        raise SystemExit("the CPU kernels did not build (see the log)")
    header = "| layer (N out × K in) | M | row-major | column-major | packed | row-major / best |"
    print(header)
    print("|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        copies = max(2, args.rotation_mb * 2**20 // (n * k * 4))
        rows = ROWS if n < 10000 else ROWS[:4]
        row_major = [torch.randn(n, k) for _ in range(copies)]
        col_major = [w.t().contiguous().t() for w in row_major]
        packed = [pack_column_tiles(w) for w in row_major]
        for m in rows:
            x = torch.randn(m, k)
            times = [
                median_us(lambda w, x=x: F.linear(x, w), row_major, args.repeats),
                median_us(lambda w, x=x: F.linear(x, w), col_major, args.repeats),
                median_us(lambda w, x=x: ops.linear_packed(x, w, None), packed, args.repeats),
            ]
            cells = " | ".join(f"{t:,.0f}" for t in times)
            print(f"| {name} | {m} | {cells} | {times[0] / min(times):.2f}× |", flush=True)
        del row_major, col_major, packed


if __name__ == "__main__":
    main()
