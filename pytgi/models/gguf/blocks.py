"""GGUF block decoders: the raw bytes of a quantized tensor straight to a `QuantizedWeight`.

Each decoder reads the ggml block layout (the same one gguf's numpy `dequantize` reads) and returns
the integer codes with their per-block float32 scales (and mins for affine types), so that
`QuantizedWeight.dequantize()` is bit for bit gguf's `dequantize`: a scale is the product of an
fp16 super-block scale and a small integer (exact in float32), and a value is one float32
product (+ one addition). Nothing goes through a float32 copy of the weight; the largest
temporaries are a few uint8 arrays of the weight's element count.

Block layouts (bytes, little endian; `d`/`dmin`/`m` are fp16; one block = 32 elements unless
stated):
    Q8_0  d | 32 int8 codes
    Q4_0  d | 16 bytes: element j < 16 is byte j's low nibble, j >= 16 byte j-16's high nibble
    Q4_1  d | m | 16 nibble bytes as Q4_0                          w = d*q + m
    Q5_0  d | qh (32 bits: bit j = element j's 5th bit) | 16 nibble bytes
    Q5_1  d | m | qh | 16 nibble bytes                              w = d*q + m
    Q4_K  (256) d | dmin | 12 bytes of eight 6-bit scales + mins | 128 nibble bytes
    Q5_K  (256) as Q4_K with 32 bytes of 5th bits before the nibbles
    Q6_K  (256) 128 low-nibble bytes | 64 bytes of 2-bit highs | 16 int8 scales | d
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight, SuperBlocks

Q = GGMLQuantizationType
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # codes [N, K], scales, mins [N, G]
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)


def decode_blocks(data: np.ndarray, qtype: GGMLQuantizationType, name: str) -> QuantizedWeight:
    """`data` [N, bytes_per_row] uint8 (a row of K elements is K/block_size blocks) -> [N, K]."""
    if qtype not in DECODERS:
        raise ModelLoadError(f"GGUF tensor `{name}` has type {qtype.name}, which is not supported")
    decode, bits, sub_block = DECODERS[qtype]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if data.ndim != 2 or data.dtype != np.uint8 or data.shape[1] % type_size:
        raise ModelLoadError(f"GGUF tensor `{name}` ({qtype.name}) has malformed data {data.shape}")
    num_rows = data.shape[0]
    blocks = data.reshape(num_rows, data.shape[1] // type_size, type_size)
    codes, scales, mins = decode(blocks)
    return QuantizedWeight(
        codes=torch.from_numpy(codes.reshape(num_rows, -1)),
        bits=bits,
        block_size=sub_block,
        scales=torch.from_numpy(scales.reshape(num_rows, -1)),
        mins=None if mins is None else torch.from_numpy(mins.reshape(num_rows, -1)),
        source=qtype.name,
        superblocks=_superblocks(blocks, qtype),
    )


def _superblocks(blocks: np.ndarray, qtype: GGMLQuantizationType) -> SuperBlocks | None:
    """Q4_K / Q6_K [N, B, bytes] -> their super-block fields (the native K-quant kernels' input)."""

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    if qtype == Q.Q4_K:
        sc, m = _k_scales_mins(blocks[..., 4:16])
        d, dmin = _f16(blocks, 0)[..., 0], _f16(blocks, 2)[..., 0]
        return SuperBlocks("Q4_K", t(d), t(sc), dmin=t(dmin), sub_mins=t(m))
    if qtype == Q.Q6_K:
        sc = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8)
        return SuperBlocks("Q6_K", t(_f16(blocks, 208)[..., 0]), t(sc))
    return None


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The fp16 field at byte `offset` of each block as float32: [N, B, 1]."""
    field = np.ascontiguousarray(blocks[..., offset : offset + 2])
    return field.view(np.float16).astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] codes: the 16 low nibbles, then the 16 high nibbles."""
    nibbles = (packed[..., None, :] >> _NIBBLE_SHIFTS[:, None]) & 0x0F  # [..., 2, 16]
    return nibbles.reshape(*packed.shape[:-1], -1)


def _bits_le(packed: np.ndarray) -> np.ndarray:
    """[..., 4] bytes of a little-endian uint32 -> [..., 32] bits, bit j at position j."""
    return np.unpackbits(packed, axis=-1, bitorder="little")


def _q8_0(blocks: np.ndarray) -> Decoded:
    return np.ascontiguousarray(blocks[..., 2:]).view(np.int8), _f16(blocks, 0), None


def _q4_0(blocks: np.ndarray) -> Decoded:
    codes = _nibbles(blocks[..., 2:]).view(np.int8) - np.int8(8)
    return codes, _f16(blocks, 0), None


def _q4_1(blocks: np.ndarray) -> Decoded:
    return _nibbles(blocks[..., 4:]), _f16(blocks, 0), _f16(blocks, 2)


def _q5_0(blocks: np.ndarray) -> Decoded:
    codes = _nibbles(blocks[..., 6:]) | (_bits_le(blocks[..., 2:6]) << 4)
    return codes.view(np.int8) - np.int8(16), _f16(blocks, 0), None


def _q5_1(blocks: np.ndarray) -> Decoded:
    codes = _nibbles(blocks[..., 8:]) | (_bits_le(blocks[..., 4:8]) << 4)
    return codes, _f16(blocks, 0), _f16(blocks, 2)


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> eight 6-bit scales and eight 6-bit mins ([..., 8] uint8 each).

    Bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same
    for the mins; bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and mins 4-7 (high nibble).
    """
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scales, mins


def _k_affine(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K per-32 scales d*sc and mins -(dmin*m): [N, B, 8] float32 each."""
    sc, m = _k_scales_mins(blocks[..., 4:16])
    scales = _f16(blocks, 0) * sc.astype(np.float32)
    mins = -(_f16(blocks, 2) * m.astype(np.float32))
    return scales, mins


def _k_nibbles(packed: np.ndarray) -> np.ndarray:
    """[..., 128] bytes -> [..., 256] codes: each 32 bytes give 32 low, then 32 high nibbles."""
    chunks = packed.reshape(*packed.shape[:-1], 4, 1, 32)
    return ((chunks >> _NIBBLE_SHIFTS[:, None]) & 0x0F).reshape(*packed.shape[:-1], 256)


def _q4_k(blocks: np.ndarray) -> Decoded:
    scales, mins = _k_affine(blocks)
    return _k_nibbles(blocks[..., 16:144]), scales, mins


def _q5_k(blocks: np.ndarray) -> Decoded:
    scales, mins = _k_affine(blocks)
    high = np.unpackbits(blocks[..., 16:48, None], axis=-1, bitorder="little")  # [N, B, 32, 8]
    high = np.swapaxes(high, -1, -2).reshape(*blocks.shape[:-1], 256)  # bit i of byte l -> 32i+l
    return _k_nibbles(blocks[..., 48:176]) | (high << 4), scales, mins


def _q6_k(blocks: np.ndarray) -> Decoded:
    lead = blocks.shape[:-1]
    # each 128-element half: 64 low nibbles then 64 high nibbles of its 64 ql bytes
    low = blocks[..., 0:128].reshape(*lead, 2, 1, 64) >> _NIBBLE_SHIFTS[:, None]
    low = (low & 0x0F).reshape(*lead, 256)
    # each half: 2-bit fields 0, 2, 4, 6 of its 32 qh bytes give elements 0-31, 32-63, ...
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    high = (blocks[..., 128:192].reshape(*lead, 2, 1, 32) >> shifts) & 0x03
    codes = (low | (high.reshape(*lead, 256) << 4)).view(np.int8) - np.int8(32)
    scales = np.ascontiguousarray(blocks[..., 192:208]).view(np.int8).astype(np.float32)
    return codes, _f16(blocks, 208) * scales, None


# type -> (decoder, bits of the codes, elements per scale)
DECODERS: dict[GGMLQuantizationType, tuple[Callable[[np.ndarray], Decoded], int, int]] = {
    Q.Q8_0: (_q8_0, 8, 32),
    Q.Q4_0: (_q4_0, 4, 32),
    Q.Q4_1: (_q4_1, 4, 32),
    Q.Q5_0: (_q5_0, 5, 32),
    Q.Q5_1: (_q5_1, 5, 32),
    Q.Q4_K: (_q4_k, 4, 32),
    Q.Q5_K: (_q5_k, 5, 32),
    Q.Q6_K: (_q6_k, 6, 16),
}
