"""The Triton layer kernels (backends/cuda/ops.py) against the layers' plain-torch references, in
fp32 and bf16 (on CPU through Triton's interpreter, on the GPU when there is one)."""

from __future__ import annotations

import pytest
import torch

from pytgi.backends.cuda import ops
from pytgi.layers.activation import SiluAndMul
from pytgi.layers.norm import RMSNorm
from pytgi.layers.rotary import ApplyRotary, apply_rotary, get_rope

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


def _built_on_cuda(make):
    """A layer built as on the CUDA platform (the Triton kernels as its kernels)."""
    from pytgi.layers.build_context import BuildContext, build_context

    with build_context(BuildContext(platform_name="cuda", kernels=ops)):
        return make()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layers_the_triton_kernels_do_not_cover_run_their_reference(device, dtype):
    """Interleaved rotary (GPT-J, Cohere) and Gemma's (1 + w) RMSNorm have no Triton kernel: on
    the CUDA platform they run the reference exactly; rotate-half rotary and Llama's RMSNorm keep
    the kernel."""
    torch.manual_seed(3)
    rope = get_rope(16, 8, 64, 10000.0, None, interleaved=True)
    cos, sin = (t.to(device) for t in rope(torch.tensor([1, 5, 40]), dtype))
    x = torch.randn(3, 4, 16, device=device).to(dtype)
    rotate = _built_on_cuda(lambda: ApplyRotary(interleaved=True))
    assert rotate.kernels is None
    assert torch.equal(rotate(x.clone(), cos, sin), apply_rotary(x, cos, sin, interleaved=True))
    assert _built_on_cuda(ApplyRotary).kernels is ops

    gemma = _built_on_cuda(lambda: RMSNorm(48, params_dtype=dtype, weight_offset=1.0)).to(device)
    gemma.weight.data.normal_(0.0, 0.5)
    gemma.process_weights_after_loading()
    x = torch.randn(5, 48, device=device).to(dtype)
    assert gemma.kernels is None and torch.equal(gemma(x), gemma.forward_native(x))
    assert _built_on_cuda(lambda: RMSNorm(48)).kernels is ops
