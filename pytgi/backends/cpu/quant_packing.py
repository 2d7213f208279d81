"""Loaded quantized weights -> the CPU kernels' packed layouts (quant_layout.py): what
`CpuQuantOps.pack` does for the quantized linear methods, which name the layout they want.

The pieces are `QuantizedWeight` / `CodebookWeight` objects (layers/quantization/
quantized_weight.py), read by their fields only: codes, scales, mins, bits, block_size, ...

A layer runs one kernel type. The shards of a fused layer (q/k/v, gate/up) may come in different
types (GGUF Q4_K_M holds Q4_K and Q6_K shards); they are converted to one, losslessly: scale blocks
are split to the smallest block among the shards (a block's scale repeated), symmetric codes
gain zero mins when another shard is affine, and 4-bit codes fit the int8 kernel unchanged.
Symmetric 4-bit codes in an affine 4-bit layer become code + 8 with min = -8 * scale:
fma(scale, code + 8, -8 * scale) rounds the same exact value as scale * code.
"""

from __future__ import annotations

from typing import Any

import torch

from pytgi.backends.cpu.kquant_layout import KQuantWeight, fits_kquant, pack_kquant
from pytgi.backends.cpu.quant_layout import (
    FP8,
    INT4,
    INT8,
    LUT4,
    PackedQuantWeight,
    fits_half,
    pack_codes,
    pack_scales,
)
from pytgi.errors import ModelLoadError
from pytgi.utils.math import cdiv

QuantizedWeight = CodebookWeight = Any  # the layers' piece types (duck-typed here)

KERNEL_BLOCKS = (64, 32, 16)  # scale blocks the kernels read (besides one per column)


def is_int4_compatible(p: QuantizedWeight) -> bool:
    return p.bits == 4 and (p.per_channel or p.block_size % 32 == 0)


def _common_block(pieces: list, allowed: tuple[int, ...]) -> int:
    """The scale block (0: per column) every piece can be expressed in, losslessly."""
    k = pieces[0].shape[1]
    if all(p.per_channel for p in pieces):
        return 0
    blocks = [k if p.per_channel else p.block_size for p in pieces]
    for block in allowed:
        if all(b % block == 0 for b in blocks) and block <= min(blocks):
            return block
    raise ModelLoadError(f"no kernel scale block fits blocks {sorted(set(blocks))}")


def _expanded(per_block: torch.Tensor, piece, block: int) -> torch.Tensor:
    """[N, blocks of the piece] -> [N, blocks of `block`] (block 0: one column)."""
    if block == 0:
        return per_block.float()
    k = piece.shape[1]
    width = k if piece.per_channel else piece.block_size
    kblocks = cdiv(k, 32)
    rows = {16: 2 * kblocks, 32: kblocks, 64: cdiv(kblocks, 2)}[block]  # what the kernels read
    out = per_block.float().repeat_interleave(width // block, dim=1)[:, :rows]
    return torch.nn.functional.pad(out, (0, rows - out.shape[1]))  # zero scales past K


def _describe(pieces: list) -> str:
    return "+".join(dict.fromkeys(p.source or f"{p.bits}-bit/{p.block_size}" for p in pieces))


def _packed(fmt, codes, scales, mins, block, pieces, table=None) -> PackedQuantWeight:
    half = fits_half(scales) and (mins is None or fits_half(mins))
    return PackedQuantWeight(
        format=fmt,
        n=codes.shape[0],
        k=codes.shape[1],
        codes=pack_codes(codes, fmt),
        scales=pack_scales(scales, half),
        mins=None if mins is None else pack_scales(mins, half),
        table=table,
        scale_block=block,
        source=_describe(pieces),
    )


def pack_int8(pieces: list[QuantizedWeight]) -> PackedQuantWeight:
    """Row pieces (any bits <= 8) -> one INT8 kernel weight."""
    block = _common_block(pieces, KERNEL_BLOCKS)
    affine = any(p.affine for p in pieces)
    pieces = [_signed_8bit(p) if p.affine and p.bits > 7 else p for p in pieces]
    codes = torch.cat([p.codes.to(torch.int16) for p in pieces])
    scales = torch.cat([_expanded(p.scales, p, block) for p in pieces])
    mins = None
    if affine:
        mins = torch.cat(
            [_expanded(p.mins, p, block) if p.affine else torch.zeros_like(s) for p, s in
             zip(pieces, torch.split(scales, [p.shape[0] for p in pieces]), strict=True)]
        )  # fmt: skip
    return _packed(INT8, codes, scales, mins, block, pieces)


def _signed_8bit(p: QuantizedWeight) -> QuantizedWeight:
    """Affine 8-bit codes 0..255 -> the int8 kernel's signed codes: q - 128 with min + 128 s,
    when that min is exact in float32 (a GPTQ / compressed-tensors zero point with float16 or
    bfloat16 scales); the pieces then keep `mins` as affine int8 codes."""
    mins = p.mins.double() + 128 * p.scales.double()
    if not torch.equal(mins.float().double(), mins):
        raise ModelLoadError(f"{p.source}: affine 8-bit codes do not fit the int8 kernel exactly")
    codes = (p.codes.to(torch.int16) - 128).to(torch.int8)
    return _ShiftedPiece(codes, p.scales, mins.float(), p)


class _ShiftedPiece:
    """An affine piece whose codes are signed int8 (only `pack_int8` reads it)."""

    def __init__(self, codes, scales, mins, original: QuantizedWeight):
        self.codes, self.scales, self.mins = codes, scales, mins
        self.affine, self.bits = True, 8
        self.block_size, self.source = original.block_size, original.source
        self.per_channel, self.shape = original.per_channel, original.shape


def pack_int4(pieces: list[QuantizedWeight]) -> PackedQuantWeight:
    """Row pieces of 4-bit codes with 32-multiple (or per-column) blocks -> one INT4 weight."""
    for p in pieces:
        if not is_int4_compatible(p):
            raise ModelLoadError(f"{p.source or p.bits}-bit codes do not fit the 4-bit kernel")
    block = _common_block(pieces, (64, 32))
    affine = any(p.affine for p in pieces)
    codes, scales, mins = [], [], []
    for p in pieces:
        s = _expanded(p.scales, p, block)
        scales.append(s)
        if p.affine:
            codes.append(p.codes.to(torch.int16))
            mins.append(_expanded(p.mins, p, block))
        else:
            codes.append(p.codes.to(torch.int16) + 8)
            mins.append(-8 * s)
    mins_t = torch.cat(mins) if affine else None
    return _packed(INT4, torch.cat(codes), torch.cat(scales), mins_t, block, pieces)


def pack_quantized(pieces: list[QuantizedWeight], family: str = "auto") -> PackedQuantWeight:
    """Fused row pieces -> one packed weight: "int4" when every piece is 4-bit with 32-multiple
    blocks (family "auto"), else "int8"."""
    if family == "auto":
        family = "int4" if all(is_int4_compatible(p) for p in pieces) else "int8"
    return pack_int4(pieces) if family == "int4" else pack_int8(pieces)


def pack(
    pieces: list, layout: str, native_kquants: bool = False
) -> PackedQuantWeight | KQuantWeight:
    """Row pieces -> one packed weight in `layout`: "int8", "int4", "auto" (with
    `native_kquants`, the K-quant layout when every piece is a GGUF Q4_K / Q6_K tensor,
    kquant_layout.py; else int4 when every piece fits it, else int8) or "codebook" (NF4 / FP4 /
    fp8 codes, one table for the whole layer)."""
    if layout == "auto" and native_kquants and fits_kquant(pieces):
        return pack_kquant(pieces)
    if layout == "codebook":
        return pack_codebook(pieces[0].cat_rows(pieces))
    if layout == "int8":
        return pack_int8(pieces)
    if layout == "int4":
        return pack_int4(pieces)
    return pack_quantized(pieces, layout)


def pack_codebook(weight: CodebookWeight) -> PackedQuantWeight:
    """NF4 / FP4 (4-bit indices) -> LUT4; fp8 e4m3 -> FP8."""
    fmt = LUT4 if weight.bits == 4 else FP8
    block = _common_block([weight], KERNEL_BLOCKS)
    scales = _expanded(weight.scales, weight, block)
    table = weight.table.float().contiguous() if fmt == LUT4 else None
    return _packed(fmt, weight.codes, scales, None, block, [weight], table)
