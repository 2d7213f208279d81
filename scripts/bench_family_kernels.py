"""Time the building blocks the model families added, on CPU in fp32 at SmolLM-135M's widths,
against their pure-torch paths: LayerNorm with the residual add, gelu·mul and plain GELU, the
interleaved RoPE, and decode / prefill attention with logit soft-capping and ALiBi against the
same kernels without them. Prints a Markdown table (docs/PERFORMANCE.md, "Model families"): µs
per call, the minimum of --repeats runs (the least disturbed on a shared machine); the reference
is the torch path, or for the attention rows the plain kernel.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_family_kernels.py --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from pytgi.backends.cpu.kernels import load_cpu_kernels

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64


def best_us(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e6


def row(name: str, reference_us: float | None, pytgi_us: float) -> str:
    ratio = f"{reference_us / pytgi_us:.2f}×" if reference_us else ""
    reference = f"{reference_us:,.1f}" if reference_us else "—"
    return f"| {name} | {reference} | {pytgi_us:,.1f} | {ratio} |"


def norm_and_activation_rows(ops, repeats: int) -> list[str]:
    w, b = torch.randn(HIDDEN), torch.randn(HIDDEN)
    rows = []
    for tokens in (1, 16, 512):
        rows += tokens_rows(ops, tokens, w, b, repeats)
    return rows


def tokens_rows(ops, tokens: int, w, b, repeats: int) -> list[str]:
    x, res = torch.randn(tokens, HIDDEN), torch.randn(tokens, HIDDEN)
    gate_up, up = torch.randn(tokens, 2 * INTER), torch.randn(tokens, 2 * INTER)
    return [
        row(
            f"add + LayerNorm [{tokens}, {HIDDEN}]",
            best_us(lambda: F.layer_norm(res + x, (HIDDEN,), w, b, 1e-5), repeats),
            best_us(lambda: ops.add_layer_norm_(x, res, w, b, 1e-5), repeats),
        ),
        row(
            f"gelu(tanh)·mul [{tokens}, 2×{INTER}]",
            best_us(
                lambda: F.gelu(gate_up[:, :INTER], approximate="tanh") * gate_up[:, INTER:],
                repeats,
            ),
            best_us(lambda: ops.gelu_and_mul(gate_up, True), repeats),
        ),
        row(
            f"plain GELU [{tokens}, {2 * INTER}]",
            best_us(lambda: F.gelu(up), repeats),
            best_us(lambda: ops.gelu(up, False), repeats),
        ),
    ]


def rotary_rows(ops, repeats: int) -> list[str]:
    from pytgi.layers.rotary import get_rope

    rope = get_rope(HEAD_DIM, HEAD_DIM, 2048, 10000.0, None, interleaved=True)
    return [rotary_row(ops, rope, tokens, repeats) for tokens in (1, 512)]


def rotary_row(ops, rope, tokens: int, repeats: int) -> str:
    from pytgi.layers.rotary import apply_rotary

    cos, sin = rope(torch.arange(tokens), torch.float32)
    qk = torch.randn(tokens, HEADS + KV_HEADS, HEAD_DIM)
    return row(
        f"interleaved RoPE q+k [{tokens}, {HEADS + KV_HEADS}, {HEAD_DIM}]",
        best_us(lambda: apply_rotary(qk, cos, sin, True), repeats),
        best_us(lambda: ops.rotary_(qk, cos.squeeze(1), sin.squeeze(1), True), repeats),
    )


def attention_rows(ops, repeats: int) -> list[str]:
    scale, slopes = HEAD_DIM**-0.5, torch.tensor([2.0 ** (-8 * (i + 1) / 8) for i in range(HEADS)])
    rows = []
    context, block = 1024, 16
    k_cache, v_cache = (torch.randn(KV_HEADS, context, HEAD_DIM) for _ in range(2))
    tables = torch.arange(context // block).unsqueeze(0)
    first, lens = torch.zeros(1, dtype=torch.int64), torch.tensor([context])
    q = torch.randn(1, HEADS, HEAD_DIM)

    def decode(**mods):
        return lambda: ops.decode_attention(q, k_cache, v_cache, tables, first, lens, block,
                                            scale, **mods)  # fmt: skip

    plain = best_us(decode(), repeats)
    for name, mods in (("soft-cap", {"softcap": 50.0}), ("ALiBi", {"alibi": slopes})):
        rows.append(row(f"decode attention, {context} keys: plain → {name}", plain,
                        best_us(decode(**mods), repeats)))  # fmt: skip
    tokens = 512
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_DIM)
    pq, pk, pv = qkv[:, :HEADS], qkv[:, HEADS : HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS :]

    def prefill(**mods):
        return lambda: ops.prefill_attention(pq, pk, pv, scale, 0, **mods)

    plain = best_us(prefill(), max(3, repeats // 4))
    for name, mods in (("soft-cap", {"softcap": 50.0}), ("ALiBi", {"alibi": slopes})):
        rows.append(row(f"prefill attention, {tokens} tokens: plain → {name}", plain,
                        best_us(prefill(**mods), max(3, repeats // 4))))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ops = load_cpu_kernels()
    if ops is None:
        raise SystemExit("the CPU kernels did not build (see the log)")
    print("| op | reference µs | pytgi µs | reference ÷ pytgi |")
    print("|---|---|---|---|")
    for line in (
        norm_and_activation_rows(ops, args.repeats)
        + rotary_rows(ops, args.repeats)
        + attention_rows(ops, args.repeats)
    ):
        print(line)


if __name__ == "__main__":
    main()
