"""Time the quantized CPU linear kernels against the fp32 packed-tile GEMM, with the machine's
read bandwidth and fp32 GEMM rate measured in the same run, with the same clock.

For each layer shape (SmolLM-135M's and Llama-3.2-1B's), row count M and weight format: µs per
call, GB/s of weight bytes (the packed codes + scales + mins, as stored), GFLOP/s (2 M N K per
call), the speed-up over the fp32 packed GEMM, and at M = 1 the fraction of the bandwidth bound
(GB/s / measured read bandwidth). Each format runs with int8 activations (`i8`) and fp32
activations (`f32`). At M < 16 the weights rotate through >= --rotation-mb of copies so that
every call streams them from DRAM, as a decode step does; larger M is compute-bound and uses two.
`--isas avx2,avx512_vnni` times the int8-activation kernels of each named table (quant.h's
dispatch; default: the one `auto` picks) in the same interleaved passes, labelled by table.

GGUF K-quants (shapes whose K is a multiple of 256): `q4_k` / `q6_k` are the native super-block
kernels (kquant.h), `q4_k wide` / `q6_k wide` the same blocks widened into the 4-bit / int8
kernels as before them. Their blocks are random bytes with a fixed d (gguf's Python package
cannot quantize K-quants); the kernels' time does not depend on the values.

Methods are measured interleaved (one pass of each per repeat) and the best pass is kept. With
one thread the default clock is the thread's CPU time (`--clock cpu`), which a descheduled
process does not accumulate: on a shared machine it measures the kernels, not the neighbours
(memory bandwidth is still shared). `--clock wall` for wall time.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_cpu_quant.py --threads 1
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pytgi.backends.cpu.kernels import load_cpu_kernels
from pytgi.backends.cpu.kquant_layout import PackedKQuantWeight, pack_kquant
from pytgi.backends.cpu.quant_layout import FP8, PackedQuantWeight
from pytgi.backends.cpu.quant_packing import pack_codebook, pack_quantized
from pytgi.layers.quantization.quantizers import (
    quantize_codebook,
    quantize_fp8,
    quantize_per_channel_int8,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
)
from pytgi.layers.quantization.unquantized import pack_column_tiles
from pytgi.models.gguf.blocks import decode_blocks

SHAPES = {  # name: (out N, in K)
    "smol qkv": (960, 576),
    "smol o": (576, 576),
    "smol gate_up": (3072, 576),
    "smol down": (576, 1536),
    "smol lm_head": (49152, 576),
    "1b qkv": (3072, 2048),
    "1b o": (2048, 2048),
    "1b gate_up": (16384, 2048),
    "1b down": (2048, 8192),
}

# name: weight [N, K] float32 -> PackedQuantWeight
FORMATS = {
    "q8_0": lambda w: pack_quantized([quantize_q8_0(w)]),
    "int8 chan": lambda w: pack_quantized([quantize_per_channel_int8(w)]),
    "q4_0": lambda w: pack_quantized([quantize_q4_0(w)]),
    "q4_1": lambda w: pack_quantized([quantize_q4_1(w)]),
    "nf4": lambda w: pack_codebook(quantize_codebook(w, "nf4", 64)),
    "fp8": lambda w: pack_codebook(quantize_fp8(w)),
    "q4_k": lambda w: pack_kquant([kquant_blocks(w, GGMLQuantizationType.Q4_K)]),
    "q4_k wide": lambda w: pack_quantized([kquant_blocks(w, GGMLQuantizationType.Q4_K)]),
    "q6_k": lambda w: pack_kquant([kquant_blocks(w, GGMLQuantizationType.Q6_K)]),
    "q6_k wide": lambda w: pack_quantized([kquant_blocks(w, GGMLQuantizationType.Q6_K)]),
}
KQUANT_FORMATS = ("q4_k", "q4_k wide", "q6_k", "q6_k wide")
D_OFFSETS = {GGMLQuantizationType.Q4_K: (0, 2), GGMLQuantizationType.Q6_K: (208,)}


def kquant_blocks(w: torch.Tensor, qtype: GGMLQuantizationType):
    """Random `qtype` blocks of w's shape (fp16 d / dmin fields fixed at 2^-10)."""
    n, k = w.shape
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(0).integers(0, 256, (n, k // block, size), dtype=np.uint8)
    for offset in D_OFFSETS[qtype]:
        raw[..., offset : offset + 2] = np.frombuffer(np.float16(2**-10).tobytes(), np.uint8)
    return decode_blocks(raw.reshape(n, -1), qtype, "bench")


def best_pass_s(fn, items: list, clock) -> float:
    """One pass of fn over items, in seconds per call."""
    start = clock()
    for item in items:
        fn(item)
    return (clock() - start) / len(items)


def measure_roofline(clock, repeats: int = 5) -> tuple[float, float]:
    """(read GB/s of a sum over 1 GiB of fp32, fp32 torch.mm GFLOP/s at 2048^2), best of N."""
    data = torch.ones(2**28)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    data.sum(), torch.mm(a, b)
    read = min(best_pass_s(lambda _: data.sum(), [0], clock) for _ in range(repeats))
    gemm = min(best_pass_s(lambda _: torch.mm(a, b), [0], clock) for _ in range(repeats))
    return 2**30 / read / 1e9, 2 * 2048**3 / gemm / 1e9


def copies_for(num_bytes: int, rows: int, rotation_mb: int) -> int:
    return max(2, rotation_mb * 2**20 // num_bytes) if rows < 16 else 2


def row(name, m, label, seconds, num_bytes, n, k, bandwidth, fp32_s) -> str:
    gb_s = num_bytes / seconds / 1e9
    gflop_s = 2 * m * n * k / seconds / 1e9
    bound = f"{gb_s / bandwidth:.2f}" if m == 1 else ""
    return (
        f"| {name} | {m} | {label} | {seconds * 1e6:,.0f} | {gb_s:.1f} | {gflop_s:.1f} | "
        f"{fp32_s / seconds:.2f}× | {bound} |"
    )


def bench_shape(ops, name, n, k, rows, args, bandwidth, clock) -> None:
    base = torch.randn(n, k) * 0.05
    formats = {
        label: make(base) for label, make in FORMATS.items()
        if label in args.formats and (k % 256 == 0 or label not in KQUANT_FORMATS)
    }  # fmt: skip
    for m in rows:
        x = torch.randn(m, k)
        count = copies_for(n * k * 4, m, args.rotation_mb)
        cases = {"fp32 packed": (n * k * 4, _fp32_call(ops, x), [pack_column_tiles(base)] * count)}
        for label, packed in formats.items():
            copies = [_clone(packed) for _ in range(copies_for(packed.nbytes, m, args.rotation_mb))]
            if packed.format != FP8:
                for isa in args.isas:
                    name_i8 = f"{label} i8" + (f" {isa}" if len(args.isas) > 1 else "")
                    cases[name_i8] = (packed.nbytes, _quant_call(ops, x, True, isa), copies)
            if not args.i8_only:
                cases[f"{label} f32"] = (packed.nbytes, _quant_call(ops, x, False, "auto"), copies)
        if count > 2:  # distinct fp32 copies too, so that they stream from DRAM
            cases["fp32 packed"] = (
                n * k * 4,
                cases["fp32 packed"][1],
                [pack_column_tiles(base + i * 1e-3) for i in range(count)],
            )
        best = {label: float("inf") for label in cases}
        for _ in range(args.repeats + 1):  # the first pass warms up
            for label, (_, fn, items) in cases.items():
                best[label] = min(best[label], best_pass_s(fn, items, clock))
        for label, (num_bytes, _, _) in cases.items():
            print(row(name, m, label, best[label], num_bytes, n, k, bandwidth, best["fp32 packed"]))
        del cases


def _fp32_call(ops, x):
    return lambda w: ops.linear_packed(x, w, None)


def _quant_call(ops, x, int8_acts, isa):
    def call(w):
        if isinstance(w, PackedKQuantWeight):
            return ops.kquant_linear(x, *w.kernel_args(), None, int8_acts, isa=isa)
        return ops.quant_linear(x, *w.kernel_args(), None, int8_acts, isa=isa)

    return call


def _clone(p):
    if isinstance(p, PackedKQuantWeight):
        return PackedKQuantWeight(p.format, p.n, p.k, p.blob.clone(), p.d.clone(), p.source)
    return PackedQuantWeight(
        p.format, p.n, p.k, p.codes.clone(), p.scales.clone(),
        None if p.mins is None else p.mins.clone(), p.table, p.scale_block, p.source,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rotation-mb", type=int, default=256)
    parser.add_argument("--rows", default="1,4,16,256")
    parser.add_argument("--clock", choices=("cpu", "wall"), default=None)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated names")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated names")
    parser.add_argument("--isas", default="auto", help="quant tables for i8, comma-separated")
    parser.add_argument("--i8-only", action="store_true", help="skip the fp32-activation rows")
    args = parser.parse_args()
    args.formats = args.formats.split(",")
    args.isas = args.isas.split(",")
    torch.set_num_threads(args.threads)
    clock_name = args.clock or ("cpu" if args.threads == 1 else "wall")
    if clock_name == "cpu" and args.threads != 1:
        raise SystemExit("--clock cpu measures one thread: use --threads 1")
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    ops = load_cpu_kernels()
    if ops is None:
        raise SystemExit("the CPU kernels did not build (see the log)")
    bandwidth, gemm = measure_roofline(clock)
    print(
        f"threads {args.threads}, clock {clock_name}, quant kernels {ops.quant_isa()}: "
        f"read bandwidth {bandwidth:.1f} GB/s, fp32 GEMM {gemm:.1f} GFLOP/s\n"
    )
    print("| layer | M | kernel | µs | GB/s | GFLOP/s | vs fp32 | BW frac |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [int(r) for r in args.rows.split(",")]
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        shape_rows = [r for r in rows if n < 40000 or r <= 16]
        bench_shape(ops, f"{name} {n}×{k}", n, k, shape_rows, args, bandwidth, clock)
    again = measure_roofline(clock)
    print(f"\nafter: read bandwidth {again[0]:.1f} GB/s, fp32 GEMM {again[1]:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
