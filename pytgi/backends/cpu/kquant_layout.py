"""The native K-quant layout (csrc/kquant.h): GGUF Q4_K and Q6_K weights repacked at load with
their 256-value super-blocks kept, for the K-quant kernels; and its torch reference (unpacking,
exact dequantisation), which the tests and the pure-torch path use.

A logical [N, K] weight (K a multiple of 256) is cut into groups of 8 output columns (N padded
with zero columns to a multiple of 16) and super-blocks of 256 along K; each (group, super-block)
is one blob:

- Q4_K, 1152 bytes: the nibbles of its eight 32-wide sub-blocks in quant_layout.py's 4-bit layout
  (8 x 128 bytes), then the 6-bit scales [sub-block, column] (64 bytes), then the 6-bit mins (64);
- Q6_K, 1664 bytes: the low nibbles of u = code + 32 (0..63) likewise (8 x 128), the two high
  bits of u per sub-block (8 x 64 bytes: byte j*32 + c*4 + i, bits 2t..2t+1 = column c at k-quad
  j + 2t, offset i), then the int8 scales [16-wide sub-block, column] (128 bytes);

and `d` float32 [groups, super-blocks, 2, 8]: each column's d, and dmin (Q4_K; zero for Q6_K).
That is 4.75 bits per Q4_K weight (the file: 4.5) and 6.75 per Q6_K weight (6.5625; its d row 1
is zero), against 4.5
+ 1 (fp16 per-32 scales and mins) and 8 + 1 (int8 codes, fp16 per-16 scales) when they were
widened into the 4-bit and int8 kernels.

Values, bit for bit gguf's dequantize: Q4_K w = (d * sc) * q - dmin * m; Q6_K w = (d * sc) * q,
each product exact in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytgi.backends.cpu.quant_layout import GROUP, INT4, PANEL, pack_codes, unpack_codes
from pytgi.errors import ModelLoadError
from pytgi.utils.math import cdiv

Q4K, Q6K = 4, 5  # after quant_layout.py's formats 0..3
FORMAT_NAMES = {Q4K: "q4_k", Q6K: "q6_k"}
FORMATS = {"Q4_K": Q4K, "Q6_K": Q6K}
SUPER = 256
BLOB_BYTES = {Q4K: 1152, Q6K: 1664}
KERNEL_FAMILY = "kquant"


@dataclass(frozen=True)
class PackedKQuantWeight:
    """One K-quant linear weight (or a run of rows of one type) in the kernels' layout."""

    format: int
    n: int
    k: int
    blob: torch.Tensor  # uint8 [groups, K / 256, 1152 or 1664]
    d: torch.Tensor  # float32 [groups, K / 256, 2, 8]
    source: str = ""

    kernel_family = KERNEL_FAMILY
    scale_block = SUPER
    takes_int8_activations = True

    @property
    def format_name(self) -> str:
        return FORMAT_NAMES[self.format]

    @property
    def nbytes(self) -> int:
        return self.blob.nbytes + self.d.nbytes

    def kernel_args(self) -> tuple:
        """The weight arguments of the compiled kquant_linear / kquant_rows ops."""
        return (self.blob, self.d, self.format, self.n, self.k)

    def dequantize(self, g0: int = 0, g1: int | None = None) -> torch.Tensor:
        """Groups [g0, g1) dequantised in float32 [8 (g1 - g0), K], as gguf's dequantize."""
        g1 = self.blob.shape[0] if g1 is None else g1
        blob, groups, supers = self.blob[g0:g1], g1 - g0, self.blob.shape[1]
        nibbles = blob[..., :1024].reshape(groups, supers * 8, 128)
        low = unpack_codes(nibbles, INT4)  # [8G, K]
        d = _per_column(self.d[g0:g1, :, 0])  # [8G, S]
        if self.format == Q4K:
            sc = _per_column(blob[..., 1024:1088].reshape(groups, supers * 8, GROUP)).float()
            m = _per_column(blob[..., 1088:1152].reshape(groups, supers * 8, GROUP)).float()
            scale = d.repeat_interleave(8, dim=1) * sc  # [8G, 8S]
            mins = _per_column(self.d[g0:g1, :, 1]).repeat_interleave(8, dim=1) * m
            w = scale.repeat_interleave(32, dim=1) * low.float()
            return w - mins.repeat_interleave(32, dim=1)
        high = _unpack_highs(blob[..., 1024:1536], groups, supers)
        codes = (low | (high << 4)) - 32
        sc = blob[..., 1536:1664].reshape(groups, supers * 16, GROUP).view(torch.int8)
        scale = d.repeat_interleave(16, dim=1) * _per_column(sc).float()  # [8G, 16S]
        return scale.repeat_interleave(16, dim=1) * codes.float()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of the dequantised weight -> [T, K]."""
        groups, cols = ids // GROUP, ids % GROUP
        out = torch.empty(ids.numel(), self.k)
        for g in groups.unique().tolist():
            hit = groups == g
            out[hit] = self.dequantize(g, g + 1)[cols[hit]]
        return out


@dataclass(frozen=True)
class KQuantStack:
    """A fused layer whose shards mix K-quant types (Q4_K q/k beside a Q6_K v in a Q4_K_M file):
    runs of rows of one type, each its own packed weight, their outputs side by side."""

    parts: tuple[PackedKQuantWeight, ...]
    n: int
    k: int

    kernel_family = KERNEL_FAMILY
    scale_block = SUPER
    takes_int8_activations = True

    @property
    def format_name(self) -> str:
        return "+".join(p.format_name for p in self.parts)

    @property
    def source(self) -> str:
        return "+".join(dict.fromkeys(p.source for p in self.parts))

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        raise ModelLoadError("an embedding cannot mix K-quant types")  # one tensor, one type


KQuantWeight = PackedKQuantWeight | KQuantStack


def _per_column(t: torch.Tensor) -> torch.Tensor:
    """[G, rows, 8] -> [8 G, rows]."""
    return t.permute(0, 2, 1).reshape(-1, t.shape[1])


def _unpack_highs(highs: torch.Tensor, groups: int, supers: int) -> torch.Tensor:
    """[G, S, 512] bytes -> the high bits [8 G, 256 S] int32."""
    b = highs.reshape(groups, supers, 8, 2, GROUP, 4).int()  # [g, s, sub, j, c, i]
    fields = torch.stack([(b >> (2 * t)) & 3 for t in range(4)], dim=-1)  # [..., t]
    # k-quad j + 2t: [g, c, s, sub, t, j, i]
    return fields.permute(0, 4, 1, 2, 6, 3, 5).reshape(groups * GROUP, supers * SUPER)


def _grouped(per_row: torch.Tensor) -> torch.Tensor:
    """[N, S, ...] -> [groups, S, ..., 8], zero rows for the padded columns."""
    n = per_row.shape[0]
    padded = per_row.new_zeros(cdiv(n, PANEL) * PANEL, *per_row.shape[1:])
    padded[:n] = per_row
    grouped = padded.view(-1, GROUP, *per_row.shape[1:])  # [G, 8, S, ...]
    return grouped.movedim(1, -1).contiguous()


def fits_kquant(pieces: list) -> bool:
    """Every piece is a whole-super-block Q4_K / Q6_K tensor (its fields kept by the reader)."""
    return all(getattr(p, "superblocks", None) is not None for p in pieces)


def pack_kquant(pieces: list) -> KQuantWeight:
    """Row pieces carrying `superblocks` -> one packed weight per run of one type."""
    runs: list[list] = []
    for p in pieces:
        if runs and runs[-1][0].superblocks.type == p.superblocks.type:
            runs[-1].append(p)
        else:
            runs.append([p])
    parts = tuple(_pack_run(run) for run in runs)
    if len(parts) == 1:
        return parts[0]
    return KQuantStack(parts, sum(p.n for p in parts), parts[0].k)


def _pack_run(pieces: list) -> PackedKQuantWeight:
    sb = pieces[0].superblocks.cat([p.superblocks for p in pieces])
    codes = torch.cat([p.codes for p in pieces])  # [N, K]
    n, k = codes.shape
    supers, groups = k // SUPER, cdiv(n, PANEL) * PANEL // GROUP
    fmt = FORMATS[sb.type]
    if fmt == Q4K:
        nibbles = pack_codes(codes, INT4).view(groups, supers, 1024)
        sc = _grouped(sb.sub_scales.to(torch.uint8)).view(groups, supers, 64)
        mins = _grouped(sb.sub_mins.to(torch.uint8)).view(groups, supers, 64)
        blob = torch.cat([nibbles, sc, mins], dim=2)
        d = torch.stack([_grouped(sb.d), _grouped(sb.dmin)], dim=2)
    else:
        u = codes.to(torch.int16) + 32
        nibbles = pack_codes(u & 15, INT4).view(groups, supers, 1024)
        highs = _pack_highs(u >> 4, groups, supers)
        sc = _grouped(sb.sub_scales.view(torch.uint8)).view(groups, supers, 128)
        blob = torch.cat([nibbles, highs, sc], dim=2)
        d = torch.stack([_grouped(sb.d), torch.zeros(groups, supers, GROUP)], dim=2)
    return PackedKQuantWeight(fmt, n, k, blob.contiguous(), d.float().contiguous(), sb.type)


def _pack_highs(high: torch.Tensor, groups: int, supers: int) -> torch.Tensor:
    """[N, K] values 0..3 -> [G, S, 512] bytes (the module docstring's high-bit layout)."""
    n = high.shape[0]
    padded = torch.zeros(groups * GROUP, supers * SUPER, dtype=torch.int16)
    padded[:n] = high
    # [g, c, s, sub, t, j, i] -> [g, s, sub, j, c, i, t]
    f = padded.view(groups, GROUP, supers, 8, 4, 2, 4).permute(0, 2, 3, 5, 1, 6, 4)
    packed = f[..., 0] | (f[..., 1] << 2) | (f[..., 2] << 4) | (f[..., 3] << 6)
    return packed.reshape(groups, supers, 512).to(torch.uint8)


def torch_linear(x: torch.Tensor, packed: KQuantWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """The pure-torch reference: fp32 activations against the dequantised weights."""
    parts = packed.parts if isinstance(packed, KQuantStack) else (packed,)
    out = torch.cat([x @ p.dequantize()[: p.n].t() for p in parts], dim=1)
    return out if bias is None else out + bias
