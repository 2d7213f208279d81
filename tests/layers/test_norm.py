"""RMSNorm against transformers' LlamaRMSNorm, with and without the fused residual add."""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pytgi.layers.activation import SiluAndMul
from pytgi.layers.norm import RMSNorm


def test_rms_norm_matches_transformers(cpu_kernels):
    torch.manual_seed(0)
    ours, ref = RMSNorm(64, eps=1e-5), LlamaRMSNorm(64, eps=1e-5)
    weight = torch.randn(64)
    ours.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    x = torch.randn(7, 64) * 3
    exact = cpu_kernels == "torch"  # the kernel sums squares in another order
    tol = 0 if exact else 1e-6
    torch.testing.assert_close(ours(x), ref(x), rtol=tol, atol=tol)


def test_fused_residual_add(cpu_kernels):
    norm = RMSNorm(32)
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    expected_residual = residual + x
    out, new_residual = norm(x, residual.clone())
    torch.testing.assert_close(new_residual, expected_residual, rtol=0, atol=0)
    torch.testing.assert_close(out, norm(expected_residual), rtol=0, atol=0)


def test_rms_norm_bf16_computes_in_fp32():
    norm = RMSNorm(16, params_dtype=torch.bfloat16)
    x = torch.randn(3, 16) * 100
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), RMSNorm(16)(x), rtol=2e-2, atol=2e-2)


def test_silu_and_mul(cpu_kernels):
    x = torch.randn(4, 2 * 21) * 30  # 21: vector lanes and a scalar tail; large |x| saturates
    expected = torch.nn.functional.silu(x[:, :21]) * x[:, 21:]
    torch.testing.assert_close(SiluAndMul()(x), expected, rtol=1e-6, atol=1e-5)
