"""Integer codes packed into int32 words, as GPTQ, AWQ and compressed-tensors store them, and
the pieces the CPU kernels load, built from codes, zero points and scales without losing a bit.

Packing (all little-endian bit streams of `bits`-wide unsigned values):
- GPTQ (AutoGPTQ / GPTQModel / optimum): `qweight` [K * bits / 32, N] packed along K, `qzeros`
  [groups, N * bits / 32] packed along N; for 3 bits each 32 values fill 3 words with values
  crossing word boundaries (the same stream);
- AWQ GEMM: `qweight` [K, N / 8] and `qzeros` [groups, N / 8] packed along N, the 8 nibbles of a
  word holding columns 0, 2, 4, 6, 1, 3, 5, 7 of its 8;
- compressed-tensors pack-quantized: `weight_packed` [N, ceil(K * bits / 32)] along K,
  `weight_zero_point` [ceil(N * bits / 32), groups] along N; stored values are the signed ones
  plus 2 ** (bits - 1).

Every format means w = s * (q - z) for unsigned code q and zero point z of the column's group.
`integer_piece` turns that into a `QuantizedWeight` the kernels compute exactly:
- z = 2 ** (bits - 1) everywhere: symmetric signed codes q - z, scale s;
- else, when -s * z is exact in float32 (scales of float16 / bfloat16 precision): affine
  codes q with min -s * z; the kernels' fma(s, q, -s z) rounds the exact s (q - z) once;
- else signed codes q - z (when they fit int8), scale s: one rounding of s * (q - z).
So every weight is the format's own float32 dequantisation, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from pytgi.errors import ModelLoadError
from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.utils.math import cdiv

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column AWQ_ORDER[i]


def unpack_stream(packed: torch.Tensor, bits: int, count: int, dim: int) -> torch.Tensor:
    """int32 words packed along `dim` -> `count` unsigned `bits`-wide values along `dim` (int16),
    reading the words as one little-endian bit stream."""
    words = packed.movedim(dim, -1).to(torch.int32)  # [..., W]
    if 32 % bits == 0:
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)  # [32 / bits]
        values = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., W, 32 / bits]
        values = values.flatten(-2)
    else:
        raw = words.contiguous().view(torch.uint8)  # [..., 4W] little-endian bytes
        bit = (raw.unsqueeze(-1).int() >> torch.arange(8, dtype=torch.int32)) & 1  # [.., 4W, 8]
        bit = bit.flatten(-2)  # [..., 32W]
        usable = bit.shape[-1] // bits * bits
        grouped = bit[..., :usable].unflatten(-1, (-1, bits))  # [..., values, bits]
        values = (grouped << torch.arange(bits, dtype=torch.int32)).sum(-1)
    if values.shape[-1] < count:
        raise ModelLoadError(f"{values.shape[-1]} packed values where {count} are expected")
    return values[..., :count].to(torch.int16).movedim(-1, dim)


def pack_stream(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of `unpack_stream` (tests): unsigned values along `dim` -> int32 words,
    zero-padded to whole words."""
    v = values.movedim(dim, -1).long()
    count = v.shape[-1]
    nbits = cdiv(count * bits, 32) * 32
    bit = ((v.unsqueeze(-1) >> torch.arange(bits)) & 1).flatten(-2)  # [..., count * bits]
    bit = torch.nn.functional.pad(bit, (0, nbits - bit.shape[-1])).unflatten(-1, (-1, 32))
    words = (bit << torch.arange(32)).sum(-1)  # [..., W] in 0 .. 2**32 - 1
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).movedim(-1, dim)


def awq_unorder(values: torch.Tensor) -> torch.Tensor:
    """[..., N] columns in AWQ's packed order -> natural order."""
    inverse = torch.argsort(torch.tensor(AWQ_ORDER))
    return values.unflatten(-1, (-1, 8))[..., inverse].flatten(-2)


@dataclass
class GroupIndexedWeight:
    """A logical [N, K] weight whose columns pick their group through `g_idx` (GPTQ act-order,
    compressed-tensors `weight_g_idx`): w[n, k] = s[n, g] * (q[n, k] - z[n, g]), g = g_idx[k].
    Columns narrow anywhere (g_idx narrows with them); the method sorts them into contiguous
    groups at pack time (`sort_groups`)."""

    codes: torch.Tensor  # [N, K] int16 unsigned codes
    zeros: torch.Tensor  # [N, G] int16 unsigned zero points
    scales: torch.Tensor  # [N, G] float32
    g_idx: torch.Tensor  # [K] int64
    bits: int
    source: str = ""

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def narrow(self, dim: int, start: int, length: int) -> GroupIndexedWeight:
        if dim == 0:
            return replace(
                self,
                codes=self.codes.narrow(0, start, length),
                zeros=self.zeros.narrow(0, start, length),
                scales=self.scales.narrow(0, start, length),
            )
        codes, g_idx = self.codes.narrow(1, start, length), self.g_idx.narrow(0, start, length)
        return replace(self, codes=codes, g_idx=g_idx)

    def layout_key(self) -> tuple:
        return ("g_idx", self.bits)

    def dequantize(self) -> torch.Tensor:
        s, z = self.scales[:, self.g_idx], self.zeros[:, self.g_idx].float()
        return s * (self.codes.float() - z)

    def sort_groups(self, block: int = 32) -> tuple[QuantizedWeight, torch.Tensor]:
        """Columns sorted by group, each group's run zero-padded to a multiple of `block`:
        (the piece, perm [K'] int64: source column of each packed column, K for a padding
        column, which multiplies an appended zero activation)."""
        k = self.codes.shape[1]
        order = torch.argsort(self.g_idx, stable=True)
        groups, counts = torch.unique_consecutive(self.g_idx[order], return_counts=True)
        perm_parts, block_groups, start = [], [], 0
        for g, c in zip(groups.tolist(), counts.tolist(), strict=True):
            padded = cdiv(c, block) * block
            part = torch.full((padded,), k, dtype=torch.int64)
            part[:c] = order[start : start + c]
            perm_parts.append(part)
            block_groups += [g] * (padded // block)
            start += c
        perm = torch.cat(perm_parts)
        pad_codes = torch.cat([self.codes, self.codes.new_zeros(self.codes.shape[0], 1)], dim=1)
        index = torch.tensor(block_groups)
        piece = integer_piece(
            pad_codes[:, perm], self.zeros[:, index], self.scales[:, index], block, self.bits,
            self.source,
        )  # fmt: skip
        return piece, perm


def groups_to_blocks(per_group: torch.Tensor, group: int, k: int) -> tuple[torch.Tensor, int]:
    """[N, ceil(K / group)] per-group values -> ([N, K / block], block) for the largest block
    dividing both the group and K (the last group may be partial)."""
    if k % group == 0:
        return per_group, group
    block = next(b for b in (128, 64, 32, 16, 8, 4, 2, 1) if group % b == 0 and k % b == 0)
    return per_group.repeat_interleave(group // block, dim=1)[:, : k // block], block


def integer_piece(
    codes: torch.Tensor,
    zeros: torch.Tensor,
    scales: torch.Tensor,
    block: int,
    bits: int,
    source: str,
) -> QuantizedWeight:
    """Unsigned codes [N, K], unsigned zero points and scales [N, K / block] -> the exact
    `QuantizedWeight` (see the module docstring for the three cases)."""
    scales = scales.float()
    mid = 1 << (bits - 1)
    z = zeros.to(torch.int16)
    expanded_z = z.repeat_interleave(block, dim=1)[:, : codes.shape[1]]
    if bool((z == mid).all()):
        signed = (codes.to(torch.int16) - mid).to(torch.int8)
        return QuantizedWeight(signed, bits, block, scales, None, source)
    mins = -(scales.double() * z.double())
    if torch.equal(mins.float().double(), mins) and codes.max() <= 255:
        return QuantizedWeight(codes.to(torch.uint8), bits, block, scales, mins.float(), source)
    signed = codes.to(torch.int16) - expanded_z
    if signed.abs().max() > 127:
        raise ModelLoadError(
            f"{source}: {bits}-bit asymmetric codes with float32 scales cannot be held exactly"
        )
    return QuantizedWeight(signed.to(torch.int8), 8, block, scales, None, source)
