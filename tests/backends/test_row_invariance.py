"""The row-invariance contract (docs/KERNELS.md): a row's output is a function of that row alone.
The same input row gives the same bits whether its step carries 1 row or many, and whatever the
step's phase (a decode row, the k+1 rows of a verify, a chunk of a prefill). Every linear kernel
runs here: fp32 (packed tiles and the torch path), and each quantized format with int8 and fp32
activations, at row counts on both sides of every path switch (register / panel kernels, row
chunks). New kernels add themselves to `LINEARS`.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.gguf_files import random_blocks
from gguf import GGMLQuantizationType

from pytgi.backends.cpu import kernels
from pytgi.backends.cpu.kquant_layout import pack_kquant
from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.backends.cpu.quant_layout import FP8
from pytgi.backends.cpu.quant_ops import CpuQuantOps
from pytgi.backends.cpu.quant_packing import pack_codebook, pack_quantized
from pytgi.config import DeviceConfig
from pytgi.layers.quantization.quantizers import (
    quantize_codebook,
    quantize_fp8,
    quantize_per_channel_int8,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
)
from pytgi.layers.quantization.unquantized import pack_column_tiles, packed_matmul
from pytgi.models.gguf.blocks import decode_blocks

# row counts: decode (1), verify (2-5 with --speculate 1-4), the register / panel switch of the
# fp32-activation kernels (8, 9), prefill chunks, and past the int8 kernels' 64-row chunk
ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 64, 70)
# a partial 16-column tile and a K of three 32-blocks; 5 groups of 8 columns: the AVX-512 table
# runs pairs of groups on zmm and the odd one on ymm
N, K = 40, 96

QUANTIZED = {
    "Q8_0": lambda w: pack_quantized([quantize_q8_0(w)]),
    "Q4_0": lambda w: pack_quantized([quantize_q4_0(w)]),
    "Q4_1": lambda w: pack_quantized([quantize_q4_1(w)]),
    "per-channel int8": lambda w: pack_quantized([quantize_per_channel_int8(w)], "int8"),
    "nf4": lambda w: pack_codebook(quantize_codebook(w, "nf4")),
    "fp4": lambda w: pack_codebook(quantize_codebook(w, "fp4")),
    "fp8": lambda w: pack_codebook(quantize_fp8(w)),
}


# the native K-quant kernels (GGUF Q4_K / Q6_K, 256-wide super-blocks) and a fused layer mixing them
KQUANT_N, KQUANT_K = 40, 256


def _kquant(types: list[GGMLQuantizationType]):
    pieces = [
        decode_blocks(random_blocks(t, KQUANT_N // len(types), KQUANT_K, seed=i), t, "w")
        for i, t in enumerate(types)
    ]
    return pack_kquant(pieces)


KQUANTS = {
    "Q4_K": lambda: _kquant([GGMLQuantizationType.Q4_K]),
    "Q6_K": lambda: _kquant([GGMLQuantizationType.Q6_K]),
    "Q4_K+Q6_K": lambda: _kquant([GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K]),
}


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


def _inputs(seed: int = 0, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, k, generator=g) * 0.1, torch.randn(max(ROWS), k, generator=g)


def assert_row_invariant(linear, k: int = K) -> None:
    """`linear(x [M, K]) -> [M, N]`: every row of every M equals that row computed alone."""
    _, x = _inputs(k=k)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])
    for m in ROWS:
        for offset in (0, max(ROWS) - m):  # the same rows at other places in the step
            rows = linear(x[offset : offset + m])
            same = (rows == alone[offset : offset + m]).all(dim=1)
            assert bool(same.all()), f"M={m}: rows {(~same).nonzero().flatten().tolist()} differ"


def test_fp32_packed_tiles(ops):
    w, _ = _inputs()
    packed = pack_column_tiles(w)
    bias = torch.randn(packed.shape[0] * packed.shape[2])
    assert_row_invariant(lambda x: packed_matmul(x, packed, bias, ops))


@pytest.mark.parametrize("acts", ["int8", "fp32"])
@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_kernels(ops, name, acts):
    w, _ = _inputs()
    packed = QUANTIZED[name](w)
    if acts == "int8" and packed.format == FP8:
        pytest.skip("fp8 has no int8-activation kernel")
    bias = torch.randn(N)
    assert_row_invariant(lambda x: CpuQuantOps(ops).linear(x, packed, bias, acts == "int8"))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_every_table_forced_through_the_platform(ops, name):
    """Each kernel table the CPU has (AVX-512 VNNI's zmm pairs of groups, AVX2, scalar), chosen
    as the platform chooses it at start-up (DeviceConfig.quant_isa), keeps rows invariant, on
    one thread and on two (the threads split the groups at any group, odd ones included)."""
    w, _ = _inputs()
    packed = QUANTIZED[name](w)
    bias = torch.randn(N)
    threads = torch.get_num_threads()
    try:
        for isa in ops.quant_isas():
            quant_ops = CpuPlatform(DeviceConfig(quant_isa=isa)).quant_ops(torch.float32)
            assert quant_ops.isa == isa
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                assert_row_invariant(lambda x, q=quant_ops: q.linear(x, packed, bias, True))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("acts", ["int8", "fp32"])
@pytest.mark.parametrize("name", list(KQUANTS))
def test_kquant_kernels(ops, name, acts):
    packed = KQUANTS[name]()
    bias = torch.randn(KQUANT_N)
    linear = CpuQuantOps(ops).linear
    assert_row_invariant(lambda x: linear(x, packed, bias, acts == "int8"), KQUANT_K)


def test_kquant_every_table_forced_through_the_platform(ops):
    """The native K-quant int8 kernels (both formats: a fused Q4_K + Q6_K layer) on each table
    the CPU has, forced as the platform forces it at start-up, on one thread and on two."""
    packed = KQUANTS["Q4_K+Q6_K"]()
    bias = torch.randn(KQUANT_N)
    threads = torch.get_num_threads()
    try:
        for isa in ops.quant_isas():
            quant_ops = CpuPlatform(DeviceConfig(quant_isa=isa)).quant_ops(torch.float32)
            assert quant_ops.isa == isa
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                assert_row_invariant(
                    lambda x, q=quant_ops: q.linear(x, packed, bias, True), KQUANT_K
                )
    finally:
        torch.set_num_threads(threads)


def test_decode_attention_rows(ops):
    """The paged decode kernel (decode rows, and verify rows run as decode rows): each row against
    its own keys gives the same bits alone and among others of other lengths."""
    g = torch.Generator().manual_seed(3)
    kv_heads, heads, d, bs, blocks = 2, 4, 32, 16, 24
    k_cache = torch.randn(kv_heads, blocks * bs, d, generator=g)
    v_cache = torch.randn(kv_heads, blocks * bs, d, generator=g)
    rows = 7
    q = torch.randn(rows, heads, d, generator=g)
    tables = torch.randperm(blocks, generator=g)[: rows * 3].view(rows, 3).to(torch.int64)
    seq_lens = torch.tensor([1, 5, 16, 17, 30, 33, 48], dtype=torch.int64)
    first = torch.zeros(rows, dtype=torch.int64)

    def attend(idx: list[int]) -> torch.Tensor:
        return ops.decode_attention(
            q[idx].contiguous(), k_cache, v_cache, tables[idx].contiguous(), first[idx],
            seq_lens[idx], bs, d**-0.5, 0.0, None,
        )  # fmt: skip

    together = attend(list(range(rows)))
    for i in range(rows):
        assert torch.equal(together[i], attend([i])[0]), i
        assert torch.equal(together[i], attend([i, (i + 3) % rows])[0]), i
