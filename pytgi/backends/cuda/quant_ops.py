"""Quantized linear products on CUDA (`CudaQuantOps`, the platform's `QuantOps`): the weight-only
formats (GPTQ, AWQ, compressed-tensors W4A16 / W8A16 / W8A8-int run as W8A16, eetq, bitsandbytes
NF4 / FP4) and FP8 (pre-quantized or `--quantize fp8`).

Packing (`pack`, once per layer, on the host, then moved to the device): every piece becomes

    w[n, k] = scales[n, k // group] * q[n, k] + mins[n, k // group]   (integer codes), or
    w[n, k] = scales[n, k // group] * table[q[n, k]]                    (a code table: e4m3, NF4)

with `q` unsigned bytes, two per byte (low nibble first along K) when every piece has <= 4 bits.
A symmetric signed code c of `bits` bits is stored as q = c + 2 ** (bits - 1) with
min = -2 ** (bits - 1) * scale, so one formula serves every integer format.

Three products, chosen per layer and activation dtype (the same for every call):
- FP8 with one scale per output feature (per tensor, per channel) and bfloat16 activations on
  SM >= 8.9: `torch._scaled_mm`, activations quantized to e4m3 per token (dynamic, amax / 448;
  a checkpoint's static `input_scale` is not used): W8A8 as TGI runs FP8 there;
- else, with the Triton kernels on: `_wq_gemm_kernel`, which dequantizes each [BLOCK_K, BLOCK_N]
  weight tile in registers (fp32 arithmetic, rounded to the activation dtype) and multiplies it
  with `tl.dot` (fp32 accumulation; IEEE fp32 products for fp32 activations);
- else the reference (`torch_linear`): chunks of output features dequantized to the activation
  dtype and multiplied with `torch.matmul`; nothing outlives the call.

Batch invariance: the Triton kernel's tile sizes are fixed (not chosen by M) and its K loop
runs in one order, so a row's result does not depend on the other rows of the batch; the FP8
path quantizes each token on its own. (cuBLAS, under the reference path and `_scaled_mm`, may
pick its algorithm by M: those paths make no such promise.)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import reduce

import torch
import triton
import triton.language as tl

from pytgi.backends.base import QuantOps
from pytgi.backends.cuda.triton_attention import INTERPRETED, _dot
from pytgi.errors import ModelLoadError
from pytgi.utils.math import cdiv

logger = logging.getLogger(__name__)

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # fixed: a row's result never depends on M
CHUNK_ROWS = 4096  # output features the reference path dequantizes at a time
E4M3_MAX = 448.0


@dataclass
class CudaPackedWeight:
    """One layer's weight [N, K] (see the module docstring for the formula)."""

    n: int
    k: int
    codes: torch.Tensor  # [N, K] uint8, or [N, ceil(K / 2)] nibbles when `nibbles`
    scales: torch.Tensor  # [N, G] float32, G = ceil(K / group)
    mins: torch.Tensor | None  # [N, G] float32 (integer codes), None with a table
    table: torch.Tensor | None  # [2 ** bits] float32 code values, None for integer codes
    group: int  # input features per scale
    nibbles: bool
    source: str = ""
    fp8: torch.Tensor | None = None  # [N, K] float8_e4m3fn when one scale per row: `_scaled_mm`

    @property
    def format_name(self) -> str:
        return "table" if self.table is not None else ("int4" if self.nibbles else "int8")

    # the CPU methods' logging reads these
    scale_block = property(lambda self: self.group)
    takes_int8_activations = False

    def unpacked(self, n0: int = 0, n1: int | None = None) -> torch.Tensor:
        """Codes of output features [n0, n1) -> [n1 - n0, K] int32."""
        codes = self.codes[n0:n1]
        if not self.nibbles:
            return codes.int()
        pairs = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(1)  # [rows, 2 * ceil(K/2)]
        return pairs[:, : self.k].int()

    def dequantize(self, n0: int = 0, n1: int | None = None, dtype=torch.float32) -> torch.Tensor:
        """Output features [n0, n1) -> [n1 - n0, K] in `dtype` (fp32 arithmetic, one rounding)."""
        q = self.unpacked(n0, n1)
        s = self.scales[n0:n1].repeat_interleave(self.group, dim=1)[:, : self.k]
        if self.table is not None:
            return (self.table[q.long()] * s).to(dtype)
        m = self.mins[n0:n1].repeat_interleave(self.group, dim=1)[:, : self.k]
        return torch.addcmul(m, q.float(), s).to(dtype)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` [T] of the dequantized weight -> [T, K] float32."""
        sub = CudaPackedWeight(
            len(ids), self.k, self.codes[ids], self.scales[ids],
            None if self.mins is None else self.mins[ids], self.table, self.group, self.nibbles,
        )  # fmt: skip
        return sub.dequantize()


def _piece_values(p) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
    """A piece -> (unsigned codes [N, K] int16, scales [N, G] fp32, mins or None, group)."""
    k = p.shape[1]
    group = k if p.per_channel else p.block_size
    scales = p.scales.float()
    if getattr(p, "table", None) is not None:
        return p.codes.to(torch.int16), scales, None, group
    if p.affine:
        return p.codes.to(torch.int16), scales, p.mins.float(), group
    mid = 1 << (p.bits - 1)
    return p.codes.to(torch.int16) + mid, scales, -mid * scales, group


def _regroup(per_group: torch.Tensor, group: int, new_group: int, k: int) -> torch.Tensor:
    """[N, ceil(K / group)] -> [N, ceil(K / new_group)] (new_group divides group)."""
    if new_group == group:
        return per_group
    return per_group.repeat_interleave(group // new_group, dim=1)[:, : cdiv(k, new_group)]


def pack_pieces(pieces: list, device: torch.device) -> CudaPackedWeight:
    """Row pieces of one layer (QuantizedWeight or CodebookWeight, one kind) -> the packed
    weight on `device`; no precision is lost (scales are kept in float32)."""
    tables = [getattr(p, "table", None) for p in pieces]
    if any(t is not None for t in tables) and not all(
        t is not None
        and torch.equal(t.float().view(torch.int32), tables[0].float().view(torch.int32))
        for t in tables  # bitwise: the e4m3 table holds NaNs
    ):
        raise ModelLoadError("one fused layer mixes code tables and integer codes")
    table = tables[0]
    k = pieces[0].shape[1]
    values = [_piece_values(p) for p in pieces]
    group = reduce(math.gcd, [g for *_, g in values])
    codes = torch.cat([q for q, *_ in values])
    scales = torch.cat([_regroup(s, g, group, k) for _, s, _, g in values])
    mins = (
        None
        if table is not None
        else torch.cat([_regroup(m, g, group, k) for _, _, m, g in values])
    )
    bits = max(p.bits for p in pieces)
    nibbles = bits <= 4
    if nibbles:
        padded = torch.nn.functional.pad(codes, (0, k % 2))
        packed = (padded[:, 0::2] | (padded[:, 1::2] << 4)).to(torch.uint8)
    else:
        packed = codes.to(torch.uint8)
    source = "+".join(dict.fromkeys(p.source or f"{p.bits}-bit" for p in pieces))
    codes_dev = packed.to(device)
    fp8 = None  # the same bytes as e4m3 (no copy) where one scale per row lets _scaled_mm run
    if table is not None and group >= k and all(p.source.startswith("fp8") for p in pieces):
        fp8 = codes_dev.view(torch.float8_e4m3fn)
    return CudaPackedWeight(
        n=codes.shape[0], k=k, codes=codes_dev, scales=scales.contiguous().to(device),
        mins=None if mins is None else mins.contiguous().to(device),
        table=None if table is None else table.float().to(device), group=group,
        nibbles=nibbles, source=source, fp8=fp8,
    )  # fmt: skip


def torch_linear(
    x: torch.Tensor, packed: CudaPackedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """The reference path: x [M, K] against chunks of output features dequantized to x's dtype."""
    out = x.new_empty(x.shape[0], packed.n)  # [M, N]
    for n0 in range(0, packed.n, CHUNK_ROWS):
        n1 = min(n0 + CHUNK_ROWS, packed.n)
        torch.matmul(x, packed.dequantize(n0, n1, x.dtype).t(), out=out[:, n0:n1])
    return out if bias is None else out + bias.to(out.dtype)


@triton.jit
def _wq_gemm_kernel(
    x_ptr, q_ptr, s_ptr, m_ptr, t_ptr, b_ptr, out_ptr,
    M, N, K, GROUP, stride_xm, stride_qn, stride_sn, stride_om,
    NIBBLES: tl.constexpr, TABLE: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    UPCAST: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """out [M, N] = x [M, K] @ W^T (+ bias), W dequantized one [BK, BN] tile at a time."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk  # [BK]
        k_ok = kk < K
        x = tl.load(x_ptr + rm[:, None].to(tl.int64) * stride_xm + kk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
        wmask = k_ok[:, None] & n_ok[None, :]  # [BK, BN]
        row = rn[None, :].to(tl.int64)
        if NIBBLES:
            byte = tl.load(q_ptr + row * stride_qn + (kk // 2)[:, None], mask=wmask, other=0)
            q = (byte.to(tl.int32) >> ((kk % 2) * 4)[:, None]) & 0xF
        else:
            q = tl.load(q_ptr + row * stride_qn + kk[:, None], mask=wmask, other=0).to(tl.int32)
        g = (kk // GROUP)[:, None]
        s = tl.load(s_ptr + row * stride_sn + g, mask=wmask, other=0.0)
        if TABLE:
            w = tl.load(t_ptr + q, mask=wmask, other=0.0) * s
        else:
            w = q.to(tl.float32) * s + tl.load(m_ptr + row * stride_sn + g, mask=wmask, other=0.0)
        acc += _dot(x, w.to(x.dtype), IEEE, UPCAST)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])  # fmt: skip


def triton_linear(
    x: torch.Tensor, packed: CudaPackedWeight, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] (fp32, fp16 or bf16, unit stride along K) -> [M, N] in x's dtype."""
    m = x.shape[0]
    out = torch.empty(m, packed.n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    scales = packed.scales
    mins = scales if packed.mins is None else packed.mins  # unread with a table
    table = scales if packed.table is None else packed.table
    grid = (cdiv(m, BLOCK_M), cdiv(packed.n, BLOCK_N))
    _wq_gemm_kernel[grid](
        x, packed.codes, scales, mins, table, out if bias is None else bias, out,
        m, packed.n, packed.k, packed.group, x.stride(0), packed.codes.stride(0),
        scales.stride(0), out.stride(0),
        NIBBLES=packed.nibbles, TABLE=packed.table is not None, HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, UPCAST=INTERPRETED,
        BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, num_warps=4,
    )  # fmt: skip
    return out


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], scale [M, 1] fp32): each row by its own amax / 448."""
    scale = (x.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=1e-12)
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_linear(x: torch.Tensor, packed: CudaPackedWeight, bias: torch.Tensor | None):
    """W8A8 FP8: per-token e4m3 activations times the e4m3 weight, row-wise scales."""
    q, scale_x = quantize_fp8_per_token(x)
    scale_w = packed.scales.reshape(1, -1)  # [1, N] (one scale per output feature)
    out = torch._scaled_mm(q, packed.fp8.t(), scale_a=scale_x, scale_b=scale_w, out_dtype=x.dtype)
    return out if bias is None else out + bias


def fp8_reference(x: torch.Tensor, packed: CudaPackedWeight, bias: torch.Tensor | None):
    """What `fp8_linear` computes, in fp32 (tests)."""
    q, scale_x = quantize_fp8_per_token(x)
    out = (q.float() * scale_x) @ packed.dequantize().t()
    return out if bias is None else out + bias.float()


@dataclass
class CudaQuantOps(QuantOps):
    """`device`: where packed weights live; `use_triton`: the Triton kernel (else the reference
    path); `scaled_mm`: whether `torch._scaled_mm` runs FP8 (SM >= 8.9)."""

    device: torch.device
    use_triton: bool = True
    scaled_mm: bool = False

    @property
    def compiled(self) -> bool:
        return False  # no int8-activation kernels here (and no CPU fused decode stack)

    def pack(self, pieces: list, layout: str) -> CudaPackedWeight:
        packed = pack_pieces(pieces, self.device)
        logger.debug("%s -> %s, group %d", packed.source, packed.format_name, packed.group)
        return packed

    def takes_fp8(self, x: torch.Tensor, packed: CudaPackedWeight) -> bool:
        return (
            self.scaled_mm and packed.fp8 is not None and x.dtype == torch.bfloat16
            and packed.k % 16 == 0 and packed.n % 16 == 0
        )  # fmt: skip

    def linear(
        self, x: torch.Tensor, packed: CudaPackedWeight, bias: torch.Tensor | None, int8_acts: bool
    ) -> torch.Tensor:
        if self.takes_fp8(x, packed):
            try:
                return fp8_linear(x, packed, bias)
            except RuntimeError as err:  # this torch / cuBLAS lacks row-wise scaling: once
                logger.warning("torch._scaled_mm unavailable (%s): fp8 weights dequantized", err)
                self.scaled_mm = False
        if self.use_triton and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
            return triton_linear(x if x.stride(-1) == 1 else x.contiguous(), packed, bias)
        return torch_linear(x, packed, bias)

    def rows(self, ids: torch.Tensor, packed: CudaPackedWeight) -> torch.Tensor:
        return packed.rows(ids)
