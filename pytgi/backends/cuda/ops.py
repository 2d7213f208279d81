"""Triton kernels for the per-token glue of a decoder layer on GPU: (residual add +) RMSNorm,
in-place rotary embedding, SiLU-and-mul. They are the CUDA platform's `kernels` for the layers'
`forward_cuda` (layers/norm.py, rotary.py, activation.py), with the same names and contracts as
the CPU kernels.

Each replaces 3-6 small ATen kernels with one; inside a captured decode step that is most of the
launches that are not matmuls. Every kernel computes in fp32 and rounds once to the model dtype,
at the points where transformers rounds (the residual sum, the normalised value before the weight).
They run on CPU tensors under `TRITON_INTERPRET=1`, which is how CI tests them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _num_warps(block: int) -> int:
    return max(1, min(16, block // 256))


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    x_stride,
    residual_stride,
    out_stride,
    hidden_size,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * residual_stride + cols, mask=mask, other=0.0)
        summed = (x + r.to(tl.float32)).to(r.dtype)  # the model-dtype sum, as torch's add
        tl.store(residual_ptr + row * residual_stride + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / hidden_size
    normed = (x * tl.rsqrt(variance + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (normed * weight).to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


def _rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    hidden_size = x.shape[-1]
    rows = x.reshape(-1, hidden_size)  # [N, D]
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out.view(x.shape)
    res = rows if residual is None else residual.view(-1, hidden_size)
    assert rows.stride(-1) == 1 and res.stride(-1) == 1, "rows must be contiguous in the last dim"
    block = triton.next_power_of_2(hidden_size)
    _rms_norm_kernel[(rows.shape[0],)](
        rows, res, weight, out, rows.stride(0), res.stride(0), out.stride(0), hidden_size, eps,
        HAS_RESIDUAL=residual is not None, BLOCK_D=block, num_warps=_num_warps(block),
    )  # fmt: skip
    return out.view(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] -> RMSNorm(x) * weight, in x's dtype."""
    return _rms_norm(x, None, weight, eps)


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual <- residual + x (in place); returns RMSNorm(residual) * weight. x, residual
    [..., D] of the same shape; residual contiguous (viewed as rows)."""
    return _rms_norm(x, residual, weight, eps)


@triton.jit
def _rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    token_stride,
    head_stride,
    table_stride,
    num_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]  # [BH, 1]
    cols = tl.arange(0, BLOCK_HALF)[None, :]  # [1, BHALF]
    mask = (heads < num_heads) & (cols < HALF)
    first = x_ptr + token * token_stride + heads * head_stride + cols  # [BH, BHALF]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    table = token * table_stride + cols
    cos1 = tl.load(cos_ptr + table, mask=cols < HALF, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + table + HALF, mask=cols < HALF, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + table, mask=cols < HALF, other=0.0).to(tl.float32)  # -sin
    sin2 = tl.load(sin_ptr + table + HALF, mask=cols < HALF, other=0.0).to(tl.float32)  # +sin
    dtype = x_ptr.dtype.element_ty
    tl.store(first, (x1 * cos1 + x2 * sin1).to(dtype), mask=mask)
    tl.store(first + HALF, (x2 * cos2 + x1 * sin2).to(dtype), mask=mask)


def rotary_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotates x [T, heads, head_dim] in place in its first rotary_dim features (rotate-half
    layout); cos / signed sin [T, rotary_dim] (layers/rotary.py's tables: sin = [-sin | sin])."""
    num_tokens, num_heads, head_dim = x.shape
    rotary_dim = cos.shape[-1]
    assert x.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous()
    assert rotary_dim % 2 == 0 and rotary_dim <= head_dim
    if num_tokens == 0:
        return
    half = rotary_dim // 2
    block_h = triton.next_power_of_2(num_heads)
    _rotary_kernel[(num_tokens,)](
        x, cos, sin, x.stride(0), x.stride(1), cos.stride(0), num_heads,
        HALF=half, BLOCK_H=block_h, BLOCK_HALF=triton.next_power_of_2(half),
        num_warps=_num_warps(block_h * half),
    )  # fmt: skip


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, out_stride, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + width + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * out_stride + cols, (silu * up).to(out_ptr.dtype.element_ty),
             mask=mask)  # fmt: skip


SILU_BLOCK = 1024


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    num_rows, double = x.shape
    width = double // 2
    out = torch.empty(num_rows, width, dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    assert x.stride(-1) == 1
    grid = (num_rows, triton.cdiv(width, SILU_BLOCK))
    _silu_and_mul_kernel[grid](x, out, x.stride(0), out.stride(0), width, BLOCK=SILU_BLOCK)
    return out
