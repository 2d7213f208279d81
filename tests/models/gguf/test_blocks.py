"""Block decoders against gguf's numpy reference: the dequantised values, bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from fixtures.gguf_files import BLOCK_TYPES, FP16_FIELDS, random_blocks
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pytgi.errors import ModelLoadError
from pytgi.models.gguf.blocks import decode_blocks

Q = GGMLQuantizationType
# type -> (code dtype, code range, elements per scale, affine)
EXPECTED = {
    Q.Q8_0: (torch.int8, (-128, 127), 32, False),
    Q.Q4_0: (torch.int8, (-8, 7), 32, False),
    Q.Q4_1: (torch.uint8, (0, 15), 32, True),
    Q.Q5_0: (torch.int8, (-16, 15), 32, False),
    Q.Q5_1: (torch.uint8, (0, 31), 32, True),
    Q.Q4_K: (torch.uint8, (0, 15), 32, True),
    Q.Q5_K: (torch.uint8, (0, 31), 32, True),
    Q.Q6_K: (torch.int8, (-32, 31), 16, False),
}
QUANTIZABLE = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]  # gguf.quants.quantize exists


def assert_bitwise_equal(actual: torch.Tensor, expected: np.ndarray) -> None:
    assert actual.dtype == torch.float32 and tuple(actual.shape) == expected.shape
    np.testing.assert_array_equal(actual.numpy().view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("rows", "blocks_per_row"), [(1, 1), (5, 3)])
def test_random_blocks_match_gguf_dequantize(qtype, rows, blocks_per_row):
    cols = GGML_QUANT_SIZES[qtype][0] * blocks_per_row
    raw = random_blocks(qtype, rows, cols, seed=rows * 7 + blocks_per_row)
    weight = decode_blocks(raw, qtype, "w")
    assert_bitwise_equal(weight.dequantize(), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_codes_scales_and_mins_have_the_interface_layout(qtype):
    dtype, (low, high), block_size, affine = EXPECTED[qtype]
    rows, cols = 4, 2 * GGML_QUANT_SIZES[qtype][0]
    weight = decode_blocks(random_blocks(qtype, rows, cols, seed=3), qtype, "w")
    assert weight.codes.dtype == dtype and tuple(weight.codes.shape) == (rows, cols)
    assert int(weight.codes.min()) >= low and int(weight.codes.max()) <= high
    assert (high - low + 1) == 2**weight.bits
    assert weight.block_size == block_size and weight.source == qtype.name
    assert weight.scales.dtype == torch.float32
    assert tuple(weight.scales.shape) == (rows, cols // block_size)
    assert (weight.mins is not None) == affine
    if affine:
        assert weight.mins.dtype == torch.float32 and weight.mins.shape == weight.scales.shape


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_gguf_quantized_weights_round_trip(qtype):
    rng = np.random.default_rng(1)
    floats = rng.standard_normal((6, 128)).astype(np.float32)
    floats[0] = 0.0  # a zero block: scale 0
    floats[1, :32] = 1e-3  # a constant block
    raw = gguf.quants.quantize(floats, qtype)
    weight = decode_blocks(raw, qtype, "w")
    assert_bitwise_equal(weight.dequantize(), gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_every_byte_value_at_every_position(qtype):
    """256 blocks whose byte p of block b is (b + p) % 256 (fp16 fields kept finite): every
    nibble, high bit and 6-bit scale pattern at every position."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(qtype, 256, block_size, seed=5)  # one block per row
    cycled = (np.arange(256)[:, None] + np.arange(type_size)[None, :]) % 256
    payload = np.ones(type_size, dtype=bool)
    for offset in FP16_FIELDS[qtype]:
        payload[offset : offset + 2] = False
    blocks[:, payload] = cycled[:, payload]
    weight = decode_blocks(blocks, qtype, "w")
    assert_bitwise_equal(weight.dequantize(), gguf.quants.dequantize(blocks, qtype))


def test_unsupported_type_is_named():
    raw = random_blocks(Q.Q8_0, 2, 32)
    with pytest.raises(ModelLoadError, match="`w` has type Q2_K, which is not supported"):
        decode_blocks(raw, Q.Q2_K, "w")


def test_malformed_data_is_refused():
    with pytest.raises(ModelLoadError, match="malformed"):
        decode_blocks(np.zeros((2, 33), dtype=np.uint8), Q.Q8_0, "w")


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q5_1], ids=lambda t: t.name)
def test_row_and_column_shards_are_exact(qtype):
    """What TP and fused layers do with a decoded weight: narrow/concatenate its rows, narrow its
    columns on block boundaries."""
    raw = random_blocks(qtype, 12, 512, seed=9)
    weight = decode_blocks(raw, qtype, "w")
    full = weight.dequantize()
    top, bottom = weight.narrow_rows(0, 5), weight.narrow_rows(5, 7)
    assert torch.equal(top.dequantize(), full[:5])
    assert torch.equal(type(weight).cat_rows([top, bottom]).dequantize(), full)
    right = weight.narrow_cols(256, 256)
    assert torch.equal(right.dequantize(), full[:, 256:])
    with pytest.raises(ModelLoadError, match="not block-aligned"):
        weight.narrow_cols(8, 256)


def test_fusing_different_formats_is_refused():
    q4k = decode_blocks(random_blocks(Q.Q4_K, 2, 256), Q.Q4_K, "q")
    q6k = decode_blocks(random_blocks(Q.Q6_K, 2, 256), Q.Q6_K, "k")
    with pytest.raises(ModelLoadError, match="formats Q4_K and Q6_K"):
        type(q4k).cat_rows([q4k, q6k])
