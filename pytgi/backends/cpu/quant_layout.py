"""The packed weight layouts of the quantized CPU kernels (csrc/quant.h), in plain torch: packing
at load time, and unpacking for the pure-torch reference path and the tests.

A logical [N, K] weight is cut into groups of 8 output columns (N padded with zero columns to a
multiple of 16, so groups pair into the fp32 path's 16-column tiles) and 32-wide blocks along K
(K padded with zero codes). Each (group, k-block) keeps its codes contiguous:

- 8-bit codes (INT8: int8 values; FP8: e4m3 bytes): 256 bytes, byte q*32 + c*4 + i = column c
  at k = 32 kb + 4 q + i (one 32-byte load = one k-quad of all 8 columns);
- 4-bit codes (INT4: 0..15; LUT4: table index): 128 bytes, byte v*32 + c*4 + i holds column c
  at k-quad v in its low nibble and k-quad v + 4 in its high nibble.

Scales (and mins) are [groups, scale_rows, 8], float16 when every value is exact in float16,
else float32; one row per scale block along K (16, 32 or 64 wide) or one row in all (per column).

Values: INT8 w = s * code (+ min); INT4 w = s * (code - 8), or s * code + min with mins; LUT4
w = s * table[code]; FP8 w = s * e4m3(code).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytgi.utils.math import cdiv

INT8, INT4, LUT4, FP8 = 0, 1, 2, 3
FORMAT_NAMES = {INT8: "int8", INT4: "int4", LUT4: "lut4", FP8: "fp8"}
GROUP = 8  # output columns per group
KBLOCK = 32  # k per block
PANEL = 16  # columns per fp32 panel: N pads to a multiple of this
SCALE_BLOCKS = (16, 32, 64, 0)  # 0: one scale per output column


def is_nibble_format(fmt: int) -> bool:
    return fmt in (INT4, LUT4)


@dataclass(frozen=True)
class PackedQuantWeight:
    """One linear weight in the kernels' layout (see the module docstring)."""

    format: int
    n: int  # output features
    k: int  # input features
    codes: torch.Tensor  # uint8 [groups, kblocks, 256 or 128]
    scales: torch.Tensor  # float32 / float16 [groups, scale_rows, 8]
    mins: torch.Tensor | None  # like scales (affine INT8 / INT4), else None
    table: torch.Tensor | None  # float32 [16] (LUT4), else None
    scale_block: int  # 16, 32, 64 or 0 (per column)
    source: str = ""  # what it was converted from, for log lines

    kernel_family = "packed"  # kquant_layout.py's weights: "kquant"

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES[self.format]

    @property
    def takes_int8_activations(self) -> bool:
        """Whether the kernels can multiply it with int8 activations (fp8 runs fp32 only)."""
        return self.format != FP8

    @property
    def nbytes(self) -> int:
        extra = 0 if self.mins is None else self.mins.nbytes
        return self.codes.nbytes + self.scales.nbytes + extra

    def kernel_args(self) -> tuple:
        """The weight arguments of the compiled quant_linear / quant_rows ops."""
        return (
            self.codes,
            self.scales,
            self.mins,
            self.table,
            self.format,
            self.n,
            self.k,
            self.scale_block,
        )

    def unpack(self, g0: int = 0, g1: int | None = None) -> tuple:
        """Groups [g0, g1) as logical tensors: (codes [8 (g1-g0), Kp] int32, scales and mins
        [8 (g1-g0), Kp] float32 expanded to one per element, mins None when symmetric)."""
        g1 = self.codes.shape[0] if g1 is None else g1
        codes = unpack_codes(self.codes[g0:g1], self.format)
        kp = codes.shape[1]
        return (
            codes,
            _expand(self.scales[g0:g1], self.scale_block, kp),
            (None if self.mins is None else _expand(self.mins[g0:g1], self.scale_block, kp)),
        )

    def dequantize(self, g0: int = 0, g1: int | None = None) -> torch.Tensor:
        """Groups [g0, g1) dequantised in float32 [8 (g1-g0), K] (the reference arithmetic;
        the kernels' fp32 path computes the same floats)."""
        codes, scales, mins = self.unpack(g0, g1)
        values = code_values(codes, self.format, self.table, mins is not None)
        if mins is None:
            w = values * scales
        else:  # one rounding, as the kernels' fma (the float64 product is exact)
            w = torch.addcmul(mins.double(), scales.double(), values.double()).float()
        return w[:, : self.k]

    def columns(self, cols: torch.Tensor) -> torch.Tensor:
        """Input-feature columns `cols` [C] of the dequantised weight -> [N, C] float32 (the
        outlier columns of LLM.int8)."""
        kb, j = cols // KBLOCK, cols % KBLOCK  # [C]
        lane = 4 * torch.arange(GROUP)  # byte offset of each column of a group
        if is_nibble_format(self.format):
            byte = ((j % 16) // 4 * 32 + j % 4).unsqueeze(1) + lane  # [C, 8]
            raw = self.codes[:, kb.unsqueeze(1), byte].int()  # [G, C, 8]
            raw = torch.where((j >= 16).view(1, -1, 1), raw >> 4, raw & 15)
        else:
            byte = ((j // 4) * 32 + j % 4).unsqueeze(1) + lane
            raw = self.codes[:, kb.unsqueeze(1), byte]
            raw = (raw.view(torch.int8) if self.format == INT8 else raw).int()
        codes = raw.permute(0, 2, 1).reshape(-1, cols.numel())  # [8G, C]
        srow = _scale_rows(self.scale_block, kb, j)

        def per_column(t: torch.Tensor) -> torch.Tensor:
            return t[:, srow].float().permute(0, 2, 1).reshape(-1, cols.numel())  # [8G, C]

        mins = None if self.mins is None else per_column(self.mins)
        values = code_values(codes, self.format, self.table, mins is not None)
        scales = per_column(self.scales)
        if mins is None:
            w = values * scales
        else:
            w = torch.addcmul(mins.double(), scales.double(), values.double()).float()
        return w[: self.n]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of the dequantised weight -> [T, K] (the tied embedding's lookup)."""
        groups, cols = ids // GROUP, ids % GROUP
        out = torch.empty(ids.numel(), self.k)
        for g in groups.unique().tolist():
            hit = groups == g
            out[hit] = self.dequantize(g, g + 1)[cols[hit]]
        return out


def code_values(codes: torch.Tensor, fmt: int, table: torch.Tensor | None, affine: bool):
    """Kernel codes -> the float values the scales multiply."""
    if fmt == LUT4:
        return table[codes.long()]
    if fmt == FP8:
        return codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    if fmt == INT4 and not affine:
        return (codes - 8).float()
    return codes.float()


def _scale_rows(scale_block: int, kb: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """The scale row of offset j in k-block kb."""
    if scale_block == 16:
        return 2 * kb + j // 16
    if scale_block == 64:
        return kb // 2
    return kb if scale_block == 32 else torch.zeros_like(kb)


def _expand(scales: torch.Tensor, scale_block: int, kp: int) -> torch.Tensor:
    """[G, rows, 8] -> [8 G, kp] float32, one value per element."""
    per_col = scales.float().permute(0, 2, 1).reshape(-1, scales.shape[1])  # [8G, rows]
    width = kp if scale_block == 0 else scale_block
    return per_col.repeat_interleave(width, dim=1)[:, :kp]


def pack_codes(codes: torch.Tensor, fmt: int) -> torch.Tensor:
    """Kernel codes [N, K] (int8 values for INT8, bytes for FP8, 0..15 for INT4 / LUT4; any
    integer dtype) -> uint8 [groups, kblocks, bytes], zero-padded to N % 16 == 0, K % 32 == 0."""
    n, k = codes.shape
    np_, kp = cdiv(n, PANEL) * PANEL, cdiv(k, KBLOCK) * KBLOCK
    padded = torch.zeros(np_, kp, dtype=torch.int16)
    padded[:n, :k] = codes.to(torch.int16)
    groups, kblocks = np_ // GROUP, kp // KBLOCK
    if not is_nibble_format(fmt):
        # [g, c, kb, q, i] -> [g, kb, q, c, i]
        tiles = padded.view(groups, GROUP, kblocks, 8, 4).permute(0, 2, 3, 1, 4)
        return (tiles.reshape(groups, kblocks, 256) & 0xFF).to(torch.uint8)
    # [g, c, kb, h, v, i] -> [g, kb, v, c, i, h]: h = 0 low nibble (quads 0-3), 1 high (4-7)
    tiles = padded.view(groups, GROUP, kblocks, 2, 4, 4).permute(0, 2, 4, 1, 5, 3)
    tiles = tiles.reshape(groups, kblocks, 128, 2)
    return (tiles[..., 0] | (tiles[..., 1] << 4)).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, fmt: int) -> torch.Tensor:
    """uint8 [groups, kblocks, bytes] -> kernel codes [8 groups, 32 kblocks] int32 (INT8 signed)."""
    groups, kblocks = packed.shape[:2]
    if not is_nibble_format(fmt):
        tiles = packed.view(groups, kblocks, 8, GROUP, 4)
        if fmt == INT8:
            tiles = tiles.view(torch.int8)
        return tiles.permute(0, 3, 1, 2, 4).reshape(groups * GROUP, kblocks * KBLOCK).int()
    b = packed.view(groups, kblocks, 4, GROUP, 4).int()
    halves = torch.stack([b & 15, b >> 4], dim=-1)  # [g, kb, v, c, i, h]
    return halves.permute(0, 3, 1, 5, 2, 4).reshape(groups * GROUP, kblocks * KBLOCK)


def pack_scales(scales: torch.Tensor, half: bool | None = None) -> torch.Tensor:
    """[N, rows] float32 -> [groups, rows, 8] (zero rows for the padded columns), float16 when
    `half` (default: when every value is exact in float16)."""
    n, rows = scales.shape
    padded = scales.new_zeros(cdiv(n, PANEL) * PANEL, rows)
    padded[:n] = scales
    packed = padded.view(-1, GROUP, rows).permute(0, 2, 1).contiguous()
    if half is None:
        half = fits_half(packed)
    return packed.half() if half else packed


def fits_half(t: torch.Tensor) -> bool:
    """Every value exact in float16 (and finite there)."""
    h = t.half()
    return bool(torch.isfinite(h).all()) and torch.equal(h.float(), t.float())
