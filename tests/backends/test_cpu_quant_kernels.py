"""The quantized linear kernels (csrc/quant_*.cpp) against each other and against torch: every ISA
table (AVX2 where this CPU has it, and the portable scalar table) on every weight format, scale
block and affine flag, on odd shapes (N not a multiple of 16, K not a multiple of 32, 1..17 and
300 rows). With int8 activations the tables agree bit for bit and match a float64 reference of
the same quantised activations; with fp32 activations they match x @ W_dequantised^T; the pure
torch path matches both; layouts round-trip; bad arguments are errors, never crashes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pytgi.backends.cpu import kernels
from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.backends.cpu.quant_layout import (
    FP8,
    INT4,
    INT8,
    LUT4,
    PackedQuantWeight,
    pack_codes,
    pack_scales,
    unpack_codes,
)
from pytgi.backends.cpu.quant_ops import int8_acts_reference, quantize_activations, torch_linear
from pytgi.config import DeviceConfig
from pytgi.errors import ConfigError
from pytgi.layers.quantization.quantizers import code_table
from pytgi.utils.math import cdiv


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


@pytest.fixture(scope="module")
def isas(ops):
    return ops.quant_isas()[::-1]  # scalar first: the reference the SIMD tables must equal


@pytest.fixture
def vnni(ops):
    if "avx512_vnni" not in ops.quant_isas():
        pytest.skip(
            "this CPU lacks AVX-512 VNNI (avx512vnni + avx512vl + avx512bw) or the build "
            "compiled it out: only the AVX2 and scalar tables run here"
        )
    return "avx512_vnni"


def random_codes(fmt: int, n: int, k: int, g: torch.Generator) -> torch.Tensor:
    if fmt == INT8:
        return torch.randint(-128, 128, (n, k), generator=g)
    if fmt == FP8:  # any byte but the two NaNs
        codes = torch.randint(0, 256, (n, k), generator=g)
        return torch.where((codes & 0x7F) == 0x7F, 0, codes)
    return torch.randint(0, 16, (n, k), generator=g)


def random_weight(fmt, n, k, block, affine=False, half=False, table="nf4", seed=0):
    g = torch.Generator().manual_seed(seed)
    kb = cdiv(k, 32)
    rows = {16: 2 * kb, 32: kb, 64: cdiv(kb, 2), 0: 1}[block]
    scales = torch.rand(n, rows, generator=g) * 0.1 + 0.01
    mins = torch.randn(n, rows, generator=g) * 0.05 if affine else None
    if half:
        scales = scales.half().float()
        mins = None if mins is None else mins.half().float()
    return PackedQuantWeight(
        format=fmt,
        n=n,
        k=k,
        codes=pack_codes(random_codes(fmt, n, k, g), fmt),
        scales=pack_scales(scales, half),
        mins=None if mins is None else pack_scales(mins, half),
        table=code_table(table) if fmt == LUT4 else None,
        scale_block=block,
    )


# (format, scale block, affine, float16 scales, N, K)
CASES = [
    (INT8, 32, False, True, 40, 96),
    (INT8, 32, True, False, 37, 64),
    (INT8, 16, False, True, 24, 160),
    (INT8, 16, True, True, 21, 96),
    (INT8, 64, False, False, 40, 96),
    (INT8, 0, False, False, 33, 70),
    (INT4, 32, False, True, 40, 128),
    (INT4, 32, True, True, 19, 96),
    (INT4, 64, False, False, 48, 160),
    (INT4, 0, True, False, 16, 40),
    (LUT4, 64, False, False, 45, 128),
    (LUT4, 32, False, True, 16, 96),
    (FP8, 0, False, False, 29, 77),
]
ROWS = [1, 2, 3, 4, 5, 17]


def case_id(case) -> str:
    fmt, block, affine, half, n, k = case
    name = {INT8: "int8", INT4: "int4", LUT4: "lut4", FP8: "fp8"}[fmt]
    return f"{name}-b{block}{'-affine' if affine else ''}{'-f16' if half else ''}-{n}x{k}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_layout_round_trip_and_rows(ops, isas, case):
    fmt, block, affine, half, n, k = case
    g = torch.Generator().manual_seed(1)
    codes = random_codes(fmt, n, k, g)
    unpacked = unpack_codes(pack_codes(codes, fmt), fmt)
    assert torch.equal(unpacked[:n, :k], codes.int())
    assert not unpacked[n:].any() and not unpacked[:, k:].any()  # zero padding
    w = random_weight(fmt, n, k, block, affine, half)
    dense = w.dequantize()[:n]
    ids = torch.tensor([0, n - 1, n // 2, 0, 7 % n])
    for isa in isas:  # the kernels' dequantisation is exact: equal to the torch reference
        assert torch.equal(ops.quant_rows(torch.arange(n), *w.kernel_args(), isa=isa), dense)
        assert torch.equal(ops.quant_rows(ids, *w.kernel_args(), isa=isa), dense[ids])
    assert torch.equal(w.rows(ids), dense[ids])
    cols = torch.tensor(sorted({0, 1, 15, 16, 31, k - 1, k // 2}))
    assert torch.equal(w.columns(cols), dense[:, cols])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fp32_activations_match_dequantised_matmul(ops, isas, case):
    fmt, block, affine, half, n, k = case
    w = random_weight(fmt, n, k, block, affine, half, seed=2)
    dense = w.dequantize()[:n].double()
    bias = torch.randn(n)
    for m in ROWS + [300]:
        x = torch.randn(m, k)
        expected = x.double() @ dense.t() + bias.double()
        scale = expected.abs().max()
        assert ((torch_linear(x, w, bias).double() - expected).abs().max() / scale) < 2e-6
        for isa in isas:
            for direct_rows in (0, 8, 1000):  # panels, the default split, registers only
                y = ops.quant_linear(
                    x, *w.kernel_args(), bias, False, isa=isa, direct_rows=direct_rows
                )
                assert ((y.double() - expected).abs().max() / scale) < 2e-6, (isa, m)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] != FP8], ids=case_id)
def test_int8_activations_bit_exact_across_isas(ops, isas, case):
    fmt, block, affine, half, n, k = case
    w = random_weight(fmt, n, k, block, affine, half, seed=3)
    bias = torch.randn(n)
    for m in ROWS + [300]:
        x = torch.randn(m, k) * torch.rand(m, 1) * 3  # rows of different ranges
        results = [ops.quant_linear(x, *w.kernel_args(), bias, True, isa=isa) for isa in isas]
        for y in results[1:]:
            assert torch.equal(y, results[0])
        expected = int8_acts_reference(x, w) + bias.double()
        scale = expected.abs().max()
        assert ((results[0].double() - expected).abs().max() / scale) < 2e-6


@pytest.mark.parametrize("fmt", [INT8, INT4, LUT4])
def test_vnni_equals_avx2_at_the_saturation_bounds(ops, vnni, fmt):
    # The largest products the int8 passes ever form: every code at its extreme (int8 -128, whose
    # |w| = 128 is maddubs' largest unsigned operand here; int4 15; the table's -1 -> -127) times
    # activations quantised to +-127, over many blocks and every row-pass size. maddubs would
    # saturate past 2^15 - 1 per int16 pair; vpdpbusd never does: equal results show the AVX2
    # path stays exact at its bounds.
    n, k = 24, 1024
    code = {INT8: -128, INT4: 15, LUT4: 0}[fmt]  # nf4's code 0 is -1.0
    w = random_weight(fmt, n, k, 32, table="nf4", seed=5)
    w.codes.copy_(pack_codes(torch.full((n, k), code), fmt))
    sign = torch.where(torch.arange(k) % 3 == 0, -1.0, 1.0)
    for m in [1, 2, 3, 4, 16, 65]:
        x = sign.repeat(m, 1) * torch.arange(1, m + 1).unsqueeze(1)  # |q| = 127 everywhere
        y_vnni = ops.quant_linear(x, *w.kernel_args(), None, True, isa=vnni)
        y_avx2 = ops.quant_linear(x, *w.kernel_args(), None, True, isa="avx2")
        assert torch.equal(y_vnni, y_avx2), m
        expected = int8_acts_reference(x, w)
        assert ((y_vnni.double() - expected).abs().max() / expected.abs().max()) < 2e-6


@pytest.mark.parametrize("fmt", [INT8, INT4])
def test_vnni_zmm_pairs_split_at_any_group(ops, vnni, fmt):
    # The AVX-512 table multiplies 4- and 8-bit codes two 8-column groups at a time (zmm) and
    # leaves an odd group to the ymm pass; the threads split the groups anywhere. Every split and
    # row count gives the scalar table's bits.
    n, k = 88, 160  # 11 groups
    w = random_weight(fmt, n, k, 32, affine=fmt == INT4, half=True, seed=7)
    threads = torch.get_num_threads()
    try:
        for m in [1, 4, 6, 65]:
            x = torch.randn(m, k)
            expected = ops.quant_linear(x, *w.kernel_args(), None, True, isa="scalar")
            for n_threads in (1, 2, 3):
                torch.set_num_threads(n_threads)
                y = ops.quant_linear(x, *w.kernel_args(), None, True, isa=vnni)
                assert torch.equal(y, expected), (m, n_threads)
    finally:
        torch.set_num_threads(threads)


def test_vnni_is_what_auto_picks_and_can_be_forced(ops, vnni):
    """The platform names its table once (DeviceConfig.quant_isa) and every product runs on it;
    "auto" is the best, an unknown or unavailable table fails at start-up."""
    assert ops.quant_isa() == vnni and ops.quant_isas() == [vnni, "avx2", "scalar"]
    w = random_weight(INT4, 40, 128, 32)
    x = torch.randn(5, 128)
    for isa in ("avx2", "scalar", vnni):  # what the layers' products run, switched
        platform = CpuPlatform(DeviceConfig(quant_isa=isa))
        assert platform.quant_isa == isa
        y = platform.quant_ops(torch.float32).linear(x, w, None, True)
        assert torch.equal(y, ops.quant_linear(x, *w.kernel_args(), None, True, isa=isa))
    platform = CpuPlatform(DeviceConfig())
    assert platform.quant_isa == vnni
    with pytest.raises(dataclasses.FrozenInstanceError):  # chosen once, at start-up
        platform.quant_isa = "avx2"
    assert ops.quant_isa() == vnni
    with pytest.raises(ConfigError, match="avx9000 quant kernels are not available"):
        CpuPlatform(DeviceConfig(quant_isa="avx9000"))


def test_activation_quantisation_matches_torch(ops, isas):
    x = torch.randn(7, 70) * torch.tensor([1e-3, 1, 50, 0, 3, 1e4, 0.5]).unsqueeze(1)
    x[1, 5] = 0.5 * 127 / 127  # exercise ties
    q_ref, scale_ref = quantize_activations(x)
    for isa in isas:
        q, scale, sums, scaled = ops.quantize_activations(x, isa=isa)
        assert torch.equal(q.int(), q_ref) and torch.equal(scale, scale_ref)
        per_block = q_ref.view(7, -1, 32)
        assert torch.equal(sums, per_block.sum(-1).int())
        halves = per_block.view(7, -1, 2, 16).sum(-1).float() * scale_ref.unsqueeze(-1)
        assert torch.equal(scaled.view(7, -1, 3)[..., 1:], halves)
    assert not q_ref[3].any()  # an all-zero row quantises to zeros with scale 0


def test_bad_arguments_are_errors(ops):
    w = random_weight(INT8, 16, 64, 32)
    args = list(w.kernel_args())
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="must be"):
        ops.quant_linear(torch.randn(2, 63), *args)
    bad = list(args)
    bad[0] = w.codes[:, :1].contiguous()  # too few k-blocks for K
    with pytest.raises(RuntimeError, match="do not fit"):
        ops.quant_linear(x, *bad)
    fp8 = random_weight(FP8, 16, 64, 0)
    with pytest.raises(RuntimeError, match="fp32 activations"):
        ops.quant_linear(x, *fp8.kernel_args(), None, True)
    lut = random_weight(LUT4, 16, 64, 32)
    bad = list(lut.kernel_args())
    bad[3] = lut.table * 2  # outside [-1, 1]
    with pytest.raises(RuntimeError, match="table"):
        ops.quant_linear(x, *bad)
    with pytest.raises(RuntimeError, match="out of range"):
        ops.quant_rows(torch.tensor([16]), *args)
    with pytest.raises(RuntimeError, match="unknown isa"):
        ops.quant_linear(x, *args, None, True, isa="avx9000")
