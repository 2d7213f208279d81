"""The Triton layer kernels (backends/cuda/ops.py) against the layers' plain-torch references, in
fp32 and bf16 (on CPU through Triton's interpreter, on the GPU when there is one)."""

from __future__ import annotations

import pytest
import torch

from pytgi.backends.cuda import ops
from pytgi.layers.activation import SiluAndMul
from pytgi.layers.norm import RMSNorm
from pytgi.layers.rotary import apply_rotary, get_rope

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # bf16: one rounding step


def close(actual, expected, dtype):
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_and_without_residual(device, dtype):
    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-5, params_dtype=dtype).to(device)
    norm.weight.data.normal_(1.0, 0.1)
    x = torch.randn(5, 48, device=device).to(dtype)
    residual = torch.randn(5, 48, device=device).to(dtype)
    close(ops.rms_norm(x, norm.weight, norm.eps), norm.forward_native(x), dtype)
    expected, expected_sum = norm.forward_native(x, residual.clone())
    out = ops.add_rms_norm_(x, residual, norm.weight, norm.eps)
    close(residual, expected_sum, dtype)
    if device.type == "cuda":  # rounded to the dtype as torch's add (the interpreter truncates)
        assert torch.equal(residual, expected_sum)
    close(out, expected, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 8])  # whole head, partial rotary
def test_rotary_in_place_on_a_strided_view(device, dtype, rotary_dim):
    torch.manual_seed(1)
    rope = get_rope(16, rotary_dim, 64, 10000.0, None)
    positions = torch.tensor([0, 3, 17, 63])
    cos, sin = rope(positions, dtype)  # [T, 1, rd]
    cos, sin = cos.to(device), sin.to(device)
    qkv = torch.randn(4, 6 + 2, 16, device=device).to(dtype)  # q and k heads, then v heads
    expected = apply_rotary(qkv[:, :6], cos, sin)
    untouched = qkv[:, 6:].clone()
    ops.rotary_(qkv[:, :6], cos.squeeze(1), sin.squeeze(1))
    close(qkv[:, :6], expected, dtype)
    assert torch.equal(qkv[:, 6:], untouched)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(device, dtype):
    torch.manual_seed(2)
    x = torch.randn(3, 2 * 40, device=device).to(dtype) * 3
    close(ops.silu_and_mul(x), SiluAndMul().forward_native(x), dtype)


def test_empty_batches(device):
    weight = torch.ones(8, device=device)
    assert ops.rms_norm(torch.empty(0, 8, device=device), weight, 1e-6).shape == (0, 8)
    assert ops.silu_and_mul(torch.empty(0, 8, device=device)).shape == (0, 4)
