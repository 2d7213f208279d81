"""`QuantizedWeight`: a linear weight held as integer codes with per-block scales (and mins).

Provisional copy written by the GGUF work (branch gguf) with exactly the interface of
notes/quant_interface.md; the kernels work (branch quantk) owns this file and replaces it.

Checkpoint readers (GGUF block decoders, on-the-fly quantizers) produce it; a linear layer's
`LinearMethod` receives it through `weight_loader(param, quantized_weight, shard_id)` and repacks
it into its kernel layout. It is never dequantised at load time: `dequantize` is the float32
reference for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytgi.errors import ModelLoadError


@dataclass
class QuantizedWeight:
    """A logical [N, K] linear weight (N output features, K input features) held as integer codes
    with per-block dequantisation along K:

        w[n, k] = scales[n, k // block_size] * codes[n, k]  (+ mins[n, k // block_size] if affine)

    computed in float32 with one rounding (the product is exact for every GGUF type), which is
    bit-for-bit what gguf's numpy `dequantize` gives.
    """

    codes: torch.Tensor  # [N, K] int8 (symmetric types: signed values, e.g. -8..7 for
    # Q4_0, -16..15 for Q5_0, -32..31 for Q6_K, -128..127 for Q8_0)
    # or uint8 (affine types: 0..2**bits-1, e.g. Q4_1, Q5_1, Q4_K, Q5_K)
    bits: int  # 4, 5, 6 or 8: the range the codes use
    block_size: int  # elements of K per scale: 16, 32, 64 or K (per channel)
    scales: torch.Tensor  # [N, K // block_size] float32
    mins: torch.Tensor | None  # [N, K // block_size] float32 for affine types, else None
    source: str = ""  # e.g. "Q4_K", "bitsandbytes-nf4": for log lines and /info

    def dequantize(self) -> torch.Tensor:
        """[N, K] float32 reference (tests only, never at load)."""
        n, k = self.codes.shape
        scales = self.scales.repeat_interleave(self.block_size, dim=1)  # [N, K]
        w = scales * self.codes.to(torch.float32)
        if self.mins is not None:
            w = w + self.mins.repeat_interleave(self.block_size, dim=1)
        return w.reshape(n, k)

    def narrow_rows(self, start: int, length: int) -> QuantizedWeight:
        """Output features [start, start + length): always exact (TP column shards)."""
        return self._with(
            self.codes.narrow(0, start, length),
            self.scales.narrow(0, start, length),
            None if self.mins is None else self.mins.narrow(0, start, length),
        )

    @classmethod
    def cat_rows(cls, parts: list[QuantizedWeight]) -> QuantizedWeight:
        """Concatenate along output features (fused q/k/v, gate/up): same format required."""
        first = parts[0]
        for part in parts[1:]:
            if (part.bits, part.block_size, part.codes.dtype, part.mins is None) != (
                first.bits,
                first.block_size,
                first.codes.dtype,
                first.mins is None,
            ):
                raise ModelLoadError(
                    f"Cannot concatenate quantized weights of formats {first.source} and "
                    f"{part.source}: convert them to one kernel format first"
                )
        mins = None if first.mins is None else torch.cat([p.mins for p in parts])
        return first._with(
            torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]), mins
        )

    def narrow_cols(self, start: int, length: int) -> QuantizedWeight:
        """Input features [start, start + length) (TP row shards): must be block-aligned."""
        if start % self.block_size or length % self.block_size:
            raise ModelLoadError(
                f"Cannot shard a {self.source or 'quantized'} weight with blocks of "
                f"{self.block_size} input features at [{start}, {start + length}): "
                "the shard is not block-aligned"
            )
        first, count = start // self.block_size, length // self.block_size
        return self._with(
            self.codes.narrow(1, start, length),
            self.scales.narrow(1, first, count),
            None if self.mins is None else self.mins.narrow(1, first, count),
        )

    def _with(self, codes, scales, mins) -> QuantizedWeight:
        return QuantizedWeight(codes, self.bits, self.block_size, scales, mins, self.source)
