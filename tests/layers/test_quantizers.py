"""The quantized weight types and the on-the-fly quantisers: fidelity to the `gguf` package's numpy
reference (Q8_0, Q4_0, Q4_1) and to bitsandbytes' own quantize functions (LLM.int8, NF4, FP4),
each method's quantise -> dequantise error bound, slicing for tensor parallelism, and the lossless
conversion of mixed fused shards into one kernel layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytgi.backends.cpu.quant_layout import INT4, INT8
from pytgi.backends.cpu.quant_packing import pack_codebook, pack_int8, pack_quantized
from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.layers.quantization.quantizers import (
    code_table,
    dynamic_map,
    quantize_codebook,
    quantize_fp8,
    quantize_per_channel_int8,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
)


def weights(n=48, k=256, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[3, 7] = 0.5  # an outlier
    w[5] = 0.0  # an all-zero row
    return w


@pytest.mark.parametrize(
    "name,quantize", [("Q8_0", quantize_q8_0), ("Q4_0", quantize_q4_0), ("Q4_1", quantize_q4_1)]
)
def test_block_formats_match_gguf_numpy_reference(name, quantize):
    gguf = pytest.importorskip("gguf")
    qtype = getattr(gguf.GGMLQuantizationType, name)
    w = weights()
    reference = gguf.dequantize(gguf.quantize(w.numpy(), qtype), qtype)
    ours = quantize(w)
    assert ours.source == name and ours.block_size == 32
    np.testing.assert_array_equal(ours.dequantize().numpy(), reference)  # bit for bit
    assert torch.equal(pack_quantized([ours]).dequantize()[: w.shape[0]], ours.dequantize())


def test_llm_int8_matches_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = weights().half()  # bitsandbytes quantises the fp16 weight
    cb, scb, _ = bnb.int8_vectorwise_quant(w.clone())
    ours = quantize_per_channel_int8(w.float(), "bitsandbytes")
    assert torch.equal(ours.codes, cb)
    assert torch.equal(ours.scales.squeeze(1), scb / 127.0)
    assert ours.per_channel and ours.block_size == w.shape[1]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_codebooks_match_bitsandbytes_double_quant(quant_type, seed):
    """TGI's `bitsandbytes-nf4|fp4` (compress_statistics=True: the 64-block absmax values
    quantized again to 8 bits in blocks of 256), bit for bit as bitsandbytes' CPU kernels."""
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = weights(n=80, k=320, seed=seed) * (1 + seed)  # 400 absmax values: two nested blocks
    packed, state = bnb.quantize_4bit(w, blocksize=64, quant_type=quant_type,
                                      compress_statistics=True)  # fmt: skip
    assert state.nested and state.state2.blocksize == 256
    raw = packed.flatten()
    bnb_codes = torch.stack([raw >> 4, raw & 15], dim=1).flatten().view(w.shape)  # high first
    ours = quantize_codebook(w, quant_type, 64)
    assert torch.equal(ours.table, state.code.float())  # the table itself, never rounded
    assert torch.equal(ours.codes, bnb_codes)
    nested = bnb.dequantize_blockwise(state.absmax, state.state2) + state.offset
    assert torch.equal(ours.scales.flatten(), nested)
    assert torch.equal(ours.dequantize(), bnb.dequantize_4bit(packed, state))
    assert torch.equal(pack_codebook(ours).dequantize()[: w.shape[0]], ours.dequantize())


def test_dynamic_map_is_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes.functional")
    assert torch.equal(dynamic_map(), bnb.create_dynamic_map())


def test_code_tables_are_bitsandbytes_published_values():
    nf4 = code_table("nf4")
    assert nf4[0] == -1 and nf4[7] == 0 and nf4[15] == 1 and bool((nf4.diff() > 0).all())
    fp4 = code_table("fp4")
    assert fp4.tolist()[:8] == pytest.approx([0, 1 / 192, 2 / 3, 1, 1 / 3, 1 / 2, 1 / 6, 1 / 4])


# method -> max |w - w_hat| / (per-block absmax), on normal weights
ERROR_BOUNDS = {
    "eetq": (lambda w: quantize_per_channel_int8(w, "eetq"), 0.5 / 127 + 1e-6),
    "q8_0": (quantize_q8_0, 0.5 / 127 + 127 * 2**-11 / 127),
    "q4_0": (quantize_q4_0, 1 / 8 + 2**-10),  # -max clips to code 7: error max / 8
    "q4_1": (quantize_q4_1, 0.5 / 15 + 2**-9),
    "nf4": (lambda w: quantize_codebook(w, "nf4"), 0.5 * (1 - 0.6961928009986877) + 1e-6),
    "fp4": (lambda w: quantize_codebook(w, "fp4"), 0.5 * (1 - 2 / 3) + 1e-6),  # widest gaps
    "fp8": (quantize_fp8, 2**-4 + 1e-6),  # e4m3: 3 mantissa bits, relative
}


@pytest.mark.parametrize("method", list(ERROR_BOUNDS))
def test_quantise_dequantise_error_bounds(method):
    quantize, bound = ERROR_BOUNDS[method]
    w = weights(seed=4)
    q = quantize(w)
    err = (q.dequantize() - w).abs()
    if method == "fp8":  # relative to each value (normal range)
        assert (err <= bound * w.abs() + 2**-9 * q.scales).all()
        return
    width = 256 if q.per_channel else q.block_size
    absmax = w.abs().view(w.shape[0], -1, width).amax(-1).repeat_interleave(width, 1)
    if method in ("nf4", "fp4"):  # the codes' absmax against the double-quantized scales
        scales = q.scales.repeat_interleave(width, 1)
        err = err - (scales - absmax).abs()  # |t s' - t s| <= |s' - s| for |t| <= 1
    if method == "q4_1":  # affine: the block's range, not its absmax
        blocks = w.view(w.shape[0], -1, 32)
        absmax = (blocks.amax(-1) - blocks.amin(-1)).repeat_interleave(32, 1)
    assert (err <= bound * absmax + 1e-9).all(), (err / absmax.clamp(min=1e-12)).max()
    assert not q.dequantize()[5].any()  # the zero row stays zero


def test_quantized_weight_slicing():
    w = quantize_q4_1(weights(32, 128))
    assert torch.equal(w.narrow_rows(8, 16).dequantize(), w.dequantize()[8:24])
    assert torch.equal(w.narrow_cols(64, 64).dequantize(), w.dequantize()[:, 64:])
    joined = QuantizedWeight.cat_rows([w.narrow_rows(0, 8), w.narrow_rows(8, 24)])
    assert torch.equal(joined.dequantize(), w.dequantize())
    with pytest.raises(ModelLoadError, match="not block-aligned"):
        w.narrow_cols(16, 64)
    with pytest.raises(ModelLoadError, match="formats Q4_1 and Q8_0"):
        QuantizedWeight.cat_rows([w, quantize_q8_0(weights(32, 128))])
    per_channel = quantize_per_channel_int8(weights(32, 128))
    part = per_channel.narrow(1, 16, 40)  # any column slice of a per-channel weight
    assert torch.equal(part.dequantize(), per_channel.dequantize()[:, 16:56])
    with pytest.raises(ModelLoadError, match="scales"):
        QuantizedWeight(w.codes, 4, 32, w.scales[:, :1], w.mins, "bad")
    with pytest.raises(ModelLoadError, match="must be"):
        QuantizedWeight(w.codes.view(torch.int8), 4, 32, w.scales, w.mins, "bad")


def test_mixed_fused_shards_convert_losslessly():
    w = weights(48, 128, seed=5)
    q6 = w[32:].reshape(16, 8, 16)  # a Q6_K-like shard: 6-bit symmetric codes, 16-wide blocks
    d = q6.abs().amax(-1) / 31
    q6k = QuantizedWeight(
        torch.round(q6 / d.unsqueeze(-1)).clamp(-32, 31).to(torch.int8).view(16, 128),
        6, 16, d, None, "Q6_K",
    )  # fmt: skip
    pieces = [quantize_q4_1(w[:16]), quantize_q8_0(w[16:32]), q6k]
    packed = pack_quantized(pieces)
    assert packed.format == INT8 and packed.scale_block == 16 and packed.mins is not None
    expected = torch.cat([p.dequantize() for p in pieces])
    assert torch.equal(packed.dequantize()[:48], expected)
    sym_and_affine = pack_quantized([quantize_q4_0(w[:16]), quantize_q4_1(w[16:32])])
    assert sym_and_affine.format == INT4 and sym_and_affine.mins is not None
    expected = torch.cat([quantize_q4_0(w[:16]).dequantize(), quantize_q4_1(w[16:32]).dequantize()])
    assert torch.equal(sym_and_affine.dequantize()[:32], expected)
    # affine 8-bit codes fit the signed int8 kernel only when min + 128 * scale is exact in fp32
    pack_int8([QuantizedWeight(torch.zeros(8, 32, dtype=torch.uint8), 8, 32,
                               torch.ones(8, 1), torch.zeros(8, 1))])  # fmt: skip
    with pytest.raises(ModelLoadError, match="affine 8-bit"):
        pack_int8([QuantizedWeight(torch.zeros(8, 32, dtype=torch.uint8), 8, 32,
                                   torch.ones(8, 1), torch.full((8, 1), 1e-3))])  # fmt: skip
