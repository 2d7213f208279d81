"""On-the-fly quantisation of full-precision weights [N, K], each with its format's arithmetic.

- `quantize_per_channel_int8`: eetq and bitsandbytes LLM.int8 weights (bitsandbytes'
  `int8_vectorwise_quant`): per output row, scale = max|w| / 127, code = round(w * 127 / max|w|)
  (ties to even);
- `quantize_q8_0`, `quantize_q4_0`, `quantize_q4_1`: GGUF's Q8_0 / Q4_0 / Q4_1 (the `gguf`
  package's numpy reference, bit for bit), 32-wide blocks with float16 scales;
- `quantize_codebook`: bitsandbytes NF4 / FP4 (`quantize_4bit(compress_statistics=True)`, as
  TGI calls it): 64-wide blocks along each row, each value to the nearest code of the table
  (bucketize on the midpoints) against its block's absmax; the absmax values themselves double
  quantized (`double_quantize`), and the weight served with those dequantised scales;
- `quantize_fp8`: e4m3 codes with one scale per output row, scale = max|w| / 448.
"""

from __future__ import annotations

import torch

from pytgi.layers.quantization.quantized_weight import CodebookWeight, QuantizedWeight
from pytgi.utils.math import cdiv

# bitsandbytes' code tables (functional.get_4bit_type), in index order.
NF4_VALUES = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
]  # fmt: skip
FP4_VALUES = [
    0,
    0.0625,
    8.0,
    12.0,
    4.0,
    6.0,
    2.0,
    3.0,
    -0,
    -0.0625,
    -8.0,
    -12.0,
    -4.0,
    -6.0,
    -2.0,
    -3.0,
]
E4M3_MAX = 448.0


def code_table(name: str) -> torch.Tensor:
    """The float32 code table of "nf4" or "fp4" (normalised to max |value| = 1, as bitsandbytes)."""
    data = torch.tensor(NF4_VALUES if name == "nf4" else FP4_VALUES, dtype=torch.float32)
    return data / data.abs().max()


def e4m3_table() -> torch.Tensor:
    """The 256 e4m3fn values in byte order (0x7f and 0xff are NaN)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()


def _blocks(w: torch.Tensor, block_size: int) -> torch.Tensor:
    n, k = w.shape
    return w.float().reshape(n, k // block_size, block_size)


def quantize_per_channel_int8(w: torch.Tensor, source: str = "int8") -> QuantizedWeight:
    absmax = w.float().abs().amax(dim=1, keepdim=True)  # [N, 1]
    codes = torch.round(w.float() * (127.0 / absmax))
    codes = torch.nan_to_num(codes, nan=0.0).to(torch.int8)  # an all-zero row: 0 / 0
    return QuantizedWeight(codes, 8, w.shape[1], absmax / 127.0, None, source)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    floored = torch.floor(a)
    return torch.sign(x) * (floored + torch.floor(2 * (a - floored)))


def _safe_inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def quantize_q8_0(w: torch.Tensor) -> QuantizedWeight:
    b = _blocks(w, 32)
    d = b.abs().amax(dim=-1, keepdim=True) / 127
    codes = _round_half_away(b * _safe_inverse(d)).to(torch.int8).reshape(w.shape)
    return QuantizedWeight(codes, 8, 32, d.squeeze(-1).half().float(), None, "Q8_0")


def quantize_q4_0(w: torch.Tensor) -> QuantizedWeight:
    b = _blocks(w, 32)
    signed_max = torch.gather(b, -1, b.abs().argmax(dim=-1, keepdim=True))
    d = signed_max / -8
    q = torch.trunc(b * _safe_inverse(d) + 8.5).clamp(0, 15) - 8
    return QuantizedWeight(
        q.to(torch.int8).reshape(w.shape), 4, 32, d.squeeze(-1).half().float(), None, "Q4_0"
    )


def quantize_q4_1(w: torch.Tensor) -> QuantizedWeight:
    b = _blocks(w, 32)
    lo, hi = b.amin(dim=-1, keepdim=True), b.amax(dim=-1, keepdim=True)
    d = (hi - lo) / 15
    q = torch.trunc((b - lo) * _safe_inverse(d) + 0.5).clamp(0, 15)
    scales, mins = d.squeeze(-1).half().float(), lo.squeeze(-1).half().float()
    return QuantizedWeight(q.to(torch.uint8).reshape(w.shape), 4, 32, scales, mins, "Q4_1")


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit "dynamic" code (`create_dynamic_map()`): 256 sorted float32
    values in [-1, 1], a decimal exponent 10^-6..10^0 times evenly spaced fractions."""
    data: list[float] = []
    for i in range(7):
        edges = torch.linspace(0.1, 1, 2**i + 1, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        data += ((10.0 ** (i - 6)) * means).tolist() + (-(10.0 ** (i - 6)) * means).tolist()
    data += [0.0, 1.0]
    return torch.tensor(sorted(data), dtype=torch.float32)


LUT_SIZE = 65536  # bitsandbytes' CPU quantize_blockwise: [-1, 1] in 65536 bins, nearest code each


def _dynamic_lut(code: torch.Tensor) -> torch.Tensor:
    """bin -> code index: bin i stands for -1 + 2 i / 65535, mapped to the first code whose
    upper midpoint is not below it."""
    midpoints = 0.5 * (code[:-1] + code[1:])
    bins = -1.0 + (2.0 * torch.arange(LUT_SIZE, dtype=torch.float32)) / (LUT_SIZE - 1)
    return torch.searchsorted(midpoints, bins)


def double_quantize(absmax: torch.Tensor, block_size: int = 256) -> torch.Tensor:
    """bitsandbytes' nested quantisation of 4-bit block scales (`compress_statistics=True`), as
    its CPU kernels compute it, returned dequantised (what its `dequantize_4bit` multiplies by):
    the mean is subtracted, the rest (flattened, row-major) quantised with the dynamic 8-bit code
    in blocks of 256 against each block's absmax, then code * absmax + mean in float32."""
    flat = absmax.float().reshape(-1)
    offset = flat.mean()
    x = flat - offset
    n = x.numel()
    padded = x.new_zeros(cdiv(n, block_size) * block_size)
    padded[:n] = x
    blocks = padded.view(-1, block_size)  # zero padding never raises a block's absmax
    scale = blocks.abs().amax(dim=1, keepdim=True)  # [B, 1]
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    normed = (blocks * inv).clamp(-1.0, 1.0)
    bins = ((normed + 1.0) * 0.5 * (LUT_SIZE - 1) + 0.5).long()  # truncation, as the C cast
    code = dynamic_map()
    q = _dynamic_lut(code)[bins]
    q = torch.where(scale > 0, q, torch.zeros_like(q))  # an all-zero block: code 0, scale 0
    dequantised = (code[q] * scale).reshape(-1)[:n] + offset
    return dequantised.reshape(absmax.shape)


def quantize_codebook(w: torch.Tensor, name: str, block_size: int = 64) -> CodebookWeight:
    """bitsandbytes' NF4 / FP4 along each row (a last partial block gets its own absmax), with
    double-quantized scales: codes and scales bit for bit as bitsandbytes' CPU `quantize_4bit(w,
    compress_statistics=True)` and its dequantised absmax when K is a multiple of 64."""
    n, k = w.shape
    nb = cdiv(k, block_size)
    padded = w.float().new_zeros(n, nb * block_size)
    padded[:, :k] = w
    b = padded.view(n, nb, block_size)
    absmax = b.abs().amax(dim=-1)  # [N, nb]
    scaled = torch.clamp(b * (1.0 / absmax.clamp(min=1e-38)).unsqueeze(-1), -1, 1)
    table = code_table(name)
    order = torch.argsort(table)
    midpoints = (table[order[:-1]] + table[order[1:]]) / 2
    q = order[torch.bucketize(scaled, midpoints)]
    codes = q.reshape(n, -1)[:, :k].to(torch.uint8)
    scales = double_quantize(absmax)
    return CodebookWeight(codes, table, 4, block_size, scales, f"bitsandbytes-{name}")


def quantize_fp8(w: torch.Tensor) -> CodebookWeight:
    absmax = w.float().abs().amax(dim=1, keepdim=True)  # [N, 1]
    scale = absmax / E4M3_MAX
    scaled = (w.float() * _safe_inverse(scale)).clamp(-E4M3_MAX, E4M3_MAX)
    codes = scaled.to(torch.float8_e4m3fn).view(torch.uint8)
    return CodebookWeight(codes, e4m3_table(), 8, w.shape[1], scale, "fp8")
