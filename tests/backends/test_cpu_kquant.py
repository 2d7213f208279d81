"""The native K-quant kernels (csrc/kquant_*.cpp, backends/cpu/kquant_layout.py) on GGUF Q4_K and
Q6_K blocks: the repacked layout dequantises to gguf's own `dequantize` bit for bit (torch
reference and compiled rows); with int8 activations every kernel table (AVX-512 VNNI, AVX2,
scalar) gives the same bits and matches a float64 product of the same quantised activations;
with fp32 activations the product matches x @ W^T on the exact weights; a fused layer mixing the
two types equals its parts side by side."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from fixtures.gguf_files import random_blocks
from gguf import GGMLQuantizationType

from pytgi.backends.cpu import kernels
from pytgi.backends.cpu.kquant_layout import KQuantStack, PackedKQuantWeight, pack_kquant
from pytgi.backends.cpu.quant_ops import CpuQuantOps
from pytgi.backends.cpu.quant_packing import pack
from pytgi.models.gguf.blocks import decode_blocks

Q = GGMLQuantizationType
KQUANTS = [Q.Q4_K, Q.Q6_K]
N, K = 40, 512  # a partial 16-column tile; two super-blocks


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


def gguf_weight(qtype, n: int = N, k: int = K, seed: int = 0):
    raw = random_blocks(qtype, n, k, seed=seed)
    return raw, decode_blocks(raw, qtype, "w")


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.uint32)


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_layout_dequantizes_as_gguf_bit_for_bit(ops, qtype):
    raw, weight = gguf_weight(qtype, n=21, k=768, seed=5)
    default = pack([weight], "auto").format_name  # without PYTGI_NATIVE_KQUANTS: widened
    assert default == ("int4" if qtype == Q.Q4_K else "int8")
    packed = pack([weight.narrow(0, 0, 5), weight.narrow(0, 5, 16)], "auto", True)
    assert isinstance(packed, PackedKQuantWeight) and packed.format_name == qtype.name.lower()
    expected = gguf.quants.dequantize(raw, qtype)
    np.testing.assert_array_equal(bits(packed.dequantize()[:21]), expected.view(np.uint32))
    ids = torch.tensor([0, 20, 7, 8, 15, 7])
    rows = ops.kquant_rows(ids, *packed.kernel_args())
    np.testing.assert_array_equal(bits(rows), expected[ids.numpy()].view(np.uint32))
    # bits per weight: the file's plus the widened d (and dmin) and the N padding
    assert packed.nbytes * 8 / (32 * 768) == {Q.Q4_K: 4.75, Q.Q6_K: 6.75}[qtype]


def test_columns_split_on_super_blocks_only():
    _, weight = gguf_weight(Q.Q4_K, n=8, k=768)
    assert weight.narrow(1, 256, 512).superblocks.d.shape == (8, 2)
    assert weight.narrow(1, 0, 288).superblocks is None  # falls back to the 4-bit kernel
    assert pack([weight.narrow(1, 0, 288)], "auto", True).format_name == "int4"


def assert_near(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-5) -> None:
    """Equal to float rounding: random blocks give outputs up to ~1e6 with cancellations, so the
    bound is relative to the largest output."""
    bound = rel * float(expected.abs().max())
    assert float((actual.double() - expected.double()).abs().max()) <= bound


def int8_reference(ops, x: torch.Tensor, packed: PackedKQuantWeight) -> torch.Tensor:
    """The int8-activation product in float64: the kernels' quantised rows times the exact
    weights."""
    q, dx, _ = ops.kquant_activations(x)
    x_eff = q.double() * dx.double().repeat_interleave(256, dim=1)
    return x_eff @ packed.dequantize()[: packed.n].double().t()


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 70])
def test_int8_activations_every_table_the_same_bits(ops, qtype, rows):
    _, weight = gguf_weight(qtype, seed=rows)
    packed = pack_kquant([weight])
    g = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, K, generator=g), torch.randn(N, generator=g)
    outs = {}
    for isa in ops.quant_isas():
        outs[isa] = ops.kquant_linear(x, *packed.kernel_args(), bias, True, isa)
        assert ops.kquant_isa(isa) == isa
    for isa, y in outs.items():
        assert torch.equal(y, outs["scalar"]), isa
    ref = int8_reference(ops, x, packed) + bias.double()
    assert_near(outs["scalar"], ref)
    # and close to the fp32 product: int8 activations per 256 lose about 0.4 % per value
    exact = x @ packed.dequantize()[:N].t() + bias
    err = (outs["scalar"] - exact).norm() / exact.norm()
    assert err < 0.02, float(err)


@pytest.mark.parametrize("qtype", KQUANTS, ids=lambda t: t.name)
def test_fp32_activations_use_the_exact_weights(ops, qtype):
    raw, weight = gguf_weight(qtype, seed=9)
    packed = pack_kquant([weight])
    x = torch.randn(5, K)
    w = torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    y = ops.kquant_linear(x, *packed.kernel_args(), None, False, "auto")
    expected = x.double() @ w.double().t()
    assert_near(y, expected)
    assert_near(CpuQuantOps(None).linear(x, packed, None, False), expected)


def test_mixed_fused_layer_is_its_parts_side_by_side(ops):
    """A Q4_K_M fused q/k/v: Q4_K q and k beside a Q6_K v."""
    _, q4 = gguf_weight(Q.Q4_K, n=24, seed=1)
    _, q6 = gguf_weight(Q.Q6_K, n=16, seed=2)
    stacked = pack([q4.narrow(0, 0, 16), q4.narrow(0, 16, 8), q6], "auto", True)
    assert isinstance(stacked, KQuantStack) and stacked.format_name == "q4_k+q6_k"
    x, bias = torch.randn(3, K), torch.randn(40)
    for int8 in (True, False):
        y = CpuQuantOps(ops).linear(x, stacked, bias, int8)
        parts = [CpuQuantOps(ops).linear(x, p, b, int8)
                 for p, b in zip(stacked.parts, bias.split([24, 16]), strict=True)]  # fmt: skip
        assert torch.equal(y, torch.cat(parts, dim=1))


def test_bad_arguments_are_errors(ops):
    _, weight = gguf_weight(Q.Q4_K)
    blob, d, fmt, n, k = pack_kquant([weight]).kernel_args()
    with pytest.raises(RuntimeError, match="K % 256"):
        ops.kquant_activations(torch.randn(2, 100))
    with pytest.raises(RuntimeError, match="unknown K-quant format"):
        ops.kquant_linear(torch.randn(1, k), blob, d, 1, n, k)
    with pytest.raises(RuntimeError, match="does not fit"):
        ops.kquant_linear(torch.randn(1, k), blob, d, fmt, n + 16, k)
    with pytest.raises(RuntimeError, match="x must be"):
        ops.kquant_linear(torch.randn(1, k + 1), blob, d, fmt, n, k)
