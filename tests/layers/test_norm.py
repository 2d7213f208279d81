"""Norms against transformers' (LlamaRMSNorm, Gemma2RMSNorm's 1 + w, nn.LayerNorm with and without
bias, CohereLayerNorm), with and without the fused residual add; the gated activations' kernels."""

from __future__ import annotations

import pytest
import torch
from transformers.models.cohere.modeling_cohere import CohereLayerNorm
from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from pytgi.layers.activation import Gelu, GeluAndMul, SiluAndMul
from pytgi.layers.norm import LayerNorm, RMSNorm


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


def test_gemma_rms_norm_scales_by_one_plus_weight(cpu_kernels):
    torch.manual_seed(0)
    ours, ref = RMSNorm(64, eps=1e-6, weight_offset=1.0), Gemma2RMSNorm(64, eps=1e-6)
    weight = torch.randn(64) * 0.1
    ours.weight.data.copy_(weight)
    ref.weight.data.copy_(weight)
    ours.process_weights_after_loading()  # the loader's call: the weight becomes 1 + w
    x, residual = torch.randn(5, 64) * 3, torch.randn(5, 64)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-6, atol=1e-6)
    out, summed = ours(x, residual.clone())
    torch.testing.assert_close(out, ref(residual + x), rtol=1e-6, atol=1e-6)


def test_gemma_rms_norm_bf16_multiplies_before_the_cast():
    weight, x = torch.randn(64) * 0.1, torch.randn(5, 64) * 3
    bf16 = RMSNorm(64, params_dtype=torch.bfloat16, weight_offset=1.0)
    bf16.weight.data.copy_(weight.bfloat16())
    bf16.process_weights_after_loading()
    ref_bf16 = Gemma2RMSNorm(64).to(torch.bfloat16)
    ref_bf16.weight.data.copy_(weight.bfloat16())
    torch.testing.assert_close(bf16(x.bfloat16()), ref_bf16(x.bfloat16()), rtol=0, atol=0)


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_torch(cpu_kernels, bias):
    torch.manual_seed(0)
    ours = LayerNorm(48, eps=1e-5, bias=bias)
    ref = torch.nn.LayerNorm(48, eps=1e-5, bias=bias) if bias else CohereLayerNorm(48, eps=1e-5)
    ours.weight.data.copy_(torch.randn(48))
    ref.weight.data.copy_(ours.weight)
    if bias:
        ours.bias.data.copy_(torch.randn(48))
        ref.bias.data.copy_(ours.bias)
    assert (ours.kernels is not None) == (cpu_kernels == "compiled")
    x, residual = torch.randn(6, 48) * 2 + 1, torch.randn(6, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)
        out, summed = ours(x, residual.clone())
        torch.testing.assert_close(summed, residual + x, rtol=0, atol=0)
        torch.testing.assert_close(out, ref(residual + x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_mul(cpu_kernels, approximate):
    x = torch.randn(4, 2 * 21) * 4  # 21: vector lanes and a scalar tail
    expected = torch.nn.functional.gelu(x[:, :21], approximate=approximate) * x[:, 21:]
    torch.testing.assert_close(GeluAndMul(approximate)(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_plain_gelu(cpu_kernels, approximate):
    x = torch.randn(3, 37) * 4  # vector lanes and a scalar tail
    expected = torch.nn.functional.gelu(x, approximate=approximate)
    gelu = Gelu(approximate)
    uses_kernel = cpu_kernels == "compiled" and approximate == "tanh"
    assert (gelu._forward == gelu.forward_cpu) == uses_kernel
    torch.testing.assert_close(gelu(x), expected, rtol=1e-5, atol=1e-5)
