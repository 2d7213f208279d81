"""The quantized-weight types linear layers load: `QuantizedWeight` (integer codes with per-block
scales along K, shared with the GGUF reader; /work/notes/quant_interface.md) and `CodebookWeight`
(indices into a table of non-uniform code values: NF4, FP4, fp8 e4m3).

Both describe a logical [N, K] weight (N output features, K input features) and support the
slicing tensor parallelism needs: output-feature rows narrow and concatenate exactly (TP shards
of column-parallel layers, fused q/k/v and gate/up); input-feature columns narrow only on scale
block boundaries (row-parallel shards), else a `ModelLoadError`. `shape` and `narrow(dim, ...)`
let the layers' weight loaders slice them as they slice tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from pytgi.errors import ModelLoadError


@dataclass
class SuperBlocks:
    """The 256-wide super-block fields of a GGUF K-quant tensor, kept beside its decoded codes so
    that the CPU kernels can run it in its own layout (backends/cpu/kquant_layout.py):

        Q4_K: w = (d * sub_scales[b]) * code - dmin * sub_mins[b]   (b: 32-wide sub-block)
        Q6_K: w = (d * sub_scales[h]) * code                        (h: 16-wide sub-block)
    """

    type: str  # "Q4_K" or "Q6_K"
    d: torch.Tensor  # [N, K / 256] float32 (the fp16 field, widened exactly)
    sub_scales: torch.Tensor  # [N, K / 256, 8] uint8 (Q4_K, 6-bit) or [N, K / 256, 16] int8 (Q6_K)
    dmin: torch.Tensor | None = None  # [N, K / 256] float32 (Q4_K)
    sub_mins: torch.Tensor | None = None  # [N, K / 256, 8] uint8 (Q4_K, 6-bit)

    def _map(self, fn) -> SuperBlocks:
        return SuperBlocks(
            self.type, fn(self.d), fn(self.sub_scales),
            None if self.dmin is None else fn(self.dmin),
            None if self.sub_mins is None else fn(self.sub_mins),
        )  # fmt: skip

    def narrow(self, dim: int, start: int, length: int) -> SuperBlocks | None:
        """Rows exactly; columns only on super-block boundaries (else None: the weight then runs
        on the other kernels)."""
        if dim == 0:
            return self._map(lambda t: t.narrow(0, start, length))
        if start % 256 or length % 256:
            return None
        return self._map(lambda t: t.narrow(1, start // 256, length // 256))

    @staticmethod
    def cat(parts: list[SuperBlocks | None]) -> SuperBlocks | None:
        if any(p is None for p in parts) or len({p.type for p in parts}) != 1:
            return None
        first = parts[0]
        return SuperBlocks(
            first.type, torch.cat([p.d for p in parts]), torch.cat([p.sub_scales for p in parts]),
            None if first.dmin is None else torch.cat([p.dmin for p in parts]),
            None if first.sub_mins is None else torch.cat([p.sub_mins for p in parts]),
        )  # fmt: skip


def expand_blocks(per_block: torch.Tensor, block_size: int, k: int) -> torch.Tensor:
    """[N, blocks] -> [N, K]: each block's value repeated over its columns."""
    return per_block.repeat_interleave(block_size, dim=1)[:, :k]


class _BlockRows:
    """Row / column slicing shared by the two weight types (fields codes, block_size, scales
    and an optional mins; scales has one column per block of K, or one per row)."""

    codes: torch.Tensor
    block_size: int
    scales: torch.Tensor
    mins: torch.Tensor | None = None
    superblocks: SuperBlocks | None = None

    def _narrow_superblocks(self, dim: int, start: int, length: int) -> SuperBlocks | None:
        return None if self.superblocks is None else self.superblocks.narrow(dim, start, length)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def per_channel(self) -> bool:
        return self.scales.shape[1] == 1 and self.block_size >= self.codes.shape[1]

    def narrow_rows(self, start: int, length: int):
        return replace(
            self,
            codes=self.codes.narrow(0, start, length),
            scales=self.scales.narrow(0, start, length),
            mins=None if self.mins is None else self.mins.narrow(0, start, length),
            superblocks=self._narrow_superblocks(0, start, length),
        )

    def narrow_cols(self, start: int, length: int):
        if self.per_channel:  # one scale per row holds for any column slice
            return replace(
                self, codes=self.codes.narrow(1, start, length), block_size=length,
                superblocks=self._narrow_superblocks(1, start, length),
            )  # fmt: skip
        k = self.codes.shape[1]
        ends_row = start + length == k  # a row's last block may be partial (ceil(K / block))
        if start % self.block_size or (length % self.block_size and not ends_row):
            raise ModelLoadError(
                f"Cannot shard a {self.source or 'quantized'} weight with blocks of "
                f"{self.block_size} input features at [{start}, {start + length}): "
                "the shard is not block-aligned"
            )
        b0, nb = start // self.block_size, -(-length // self.block_size)
        return replace(
            self,
            codes=self.codes.narrow(1, start, length),
            scales=self.scales.narrow(1, b0, nb),
            mins=None if self.mins is None else self.mins.narrow(1, b0, nb),
            superblocks=self._narrow_superblocks(1, start, length),
        )

    def narrow(self, dim: int, start: int, length: int):
        return self.narrow_rows(start, length) if dim == 0 else self.narrow_cols(start, length)

    @classmethod
    def cat_rows(cls, pieces: list):
        first = pieces[0]
        for p in pieces[1:]:
            if p.layout_key() != first.layout_key():
                raise ModelLoadError(
                    f"Cannot concatenate quantized weights of formats {first.source} and "
                    f"{p.source}: convert them to one kernel format first"
                )
        return replace(
            first,
            codes=torch.cat([p.codes for p in pieces]),
            scales=torch.cat([p.scales for p in pieces]),
            mins=None if first.mins is None else torch.cat([p.mins for p in pieces]),
            superblocks=SuperBlocks.cat([p.superblocks for p in pieces]),
        )


@dataclass
class QuantizedWeight(_BlockRows):
    """A logical [N, K] linear weight held as integer codes with per-block dequantisation along K:

        w[n, k] = scales[n, k // block_size] * codes[n, k]  (+ mins[n, k // block_size] if affine)

    computed in float32 with one rounding (the product is exact for every GGUF type), which is
    bit-for-bit what gguf's numpy `dequantize` gives.
    """

    codes: torch.Tensor  # [N, K] int8 (symmetric: signed, e.g. -8..7 for Q4_0, -128..127 for
    # Q8_0) or uint8 (affine: 0..2**bits-1, e.g. Q4_1, Q5_1, Q4_K, Q5_K)
    bits: int  # 4, 5, 6 or 8: the range the codes use
    block_size: int  # elements of K per scale: 16, 32, 64 or K (per channel)
    scales: torch.Tensor  # [N, K // block_size] float32
    mins: torch.Tensor | None  # [N, K // block_size] float32 for affine types, else None
    source: str = ""  # e.g. "Q4_K", "eetq": for log lines and /info
    superblocks: SuperBlocks | None = None  # GGUF Q4_K / Q6_K: their super-block fields

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        if self.block_size <= 0 or k % self.block_size:
            raise ModelLoadError(
                f"{k} input features are not a whole number of {self.block_size}-wide blocks"
            )
        blocks = k // self.block_size
        if tuple(self.scales.shape) != (n, blocks):
            raise ModelLoadError(f"scales {tuple(self.scales.shape)} do not match [{n}, {blocks}]")
        if self.mins is not None and self.mins.shape != self.scales.shape:
            raise ModelLoadError("mins must have the shape of the scales")
        expected = torch.uint8 if self.affine else torch.int8
        if self.codes.dtype != expected:
            raise ModelLoadError(
                f"{'affine' if self.affine else 'symmetric'} codes must be {expected}"
            )

    @property
    def affine(self) -> bool:
        return self.mins is not None

    def layout_key(self) -> tuple:
        return (self.bits, self.block_size, self.affine)

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 (tests and references only: never at load)."""
        k = self.codes.shape[1]
        scales = expand_blocks(self.scales.float(), self.block_size, k)
        if self.mins is None:
            return scales * self.codes.float()
        mins = expand_blocks(self.mins.float(), self.block_size, k)
        return (mins.double() + scales.double() * self.codes.double()).float()  # one rounding


@dataclass
class CodebookWeight(_BlockRows):
    """A logical [N, K] weight as indices into a table of code values, scaled per block along K:

        w[n, k] = scales[n, k // block_size] * table[codes[n, k]]  (float32, one rounding)

    NF4 / FP4 (bitsandbytes: 4-bit indices, 64-wide blocks, absmax scales; the last block of a
    row may be partial) and fp8 e4m3 (the byte is the index; one scale per output feature).
    """

    codes: torch.Tensor  # [N, K] uint8 indices into table
    table: torch.Tensor  # [2 ** bits] float32
    bits: int
    block_size: int
    scales: torch.Tensor  # [N, ceil(K / block_size)] float32
    source: str = ""  # "bitsandbytes-nf4", "bitsandbytes-fp4", "fp8"
    mins: None = None
    superblocks: None = None

    def layout_key(self) -> tuple:
        return (self.source, self.bits, self.block_size)

    def dequantize(self) -> torch.Tensor:
        k = self.codes.shape[1]
        scales = expand_blocks(self.scales.float(), self.block_size, k)
        return scales * self.table[self.codes.long()]
