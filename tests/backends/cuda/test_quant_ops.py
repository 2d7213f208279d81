"""The CUDA quantized linear products (backends/cuda/quant_ops.py), on CPU through Triton's
interpreter (on the GPU when there is one): the Triton W4A16 / W8A16 kernel and the dequantize-
then-matmul reference equal x @ W^T for the formats' real pieces (GPTQ 4/8/3-bit, act-order,
per channel; AWQ; compressed-tensors W4A16 / W8A8-int; FP8 per channel and block-wise; NF4),
rows do not depend on their batch, and a pre-quantized model on the CUDA platform's layers gives
the CPU runner's greedy tokens."""

from __future__ import annotations

import pytest
import torch
from fixtures.prequantized import ct_scheme, make_awq, make_compressed, make_fp8, make_gptq
from layers.test_prequantized import assemble, quant

from pytgi.backends.cuda.quant_ops import (
    CudaQuantOps,
    fp8_linear,
    fp8_reference,
    pack_pieces,
    torch_linear,
    triton_linear,
)
from pytgi.layers.quantization.int_packing import GroupIndexedWeight
from pytgi.layers.quantization.quantizers import quantize_codebook, quantize_fp8

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # relative to the output's scale


def gptq(bits, group, sym, act_order=False):
    n, k = 96, 128
    g_idx = None
    if act_order:  # each group's columns scattered over K
        g_idx = torch.randperm(k, generator=torch.Generator().manual_seed(3)) // group
    tensors, w = make_gptq(n, k, bits, group, sym, g_idx=g_idx)
    q = quant("gptq", bits=bits, group_size=group, desc_act=act_order, sym=sym)
    return assemble(q, tensors), w


def awq():
    tensors, w = make_awq(64, 128, 32)
    return assemble(quant("awq", bits=4, group_size=32), tensors), w


def compressed(fmt, bits, strategy):
    pytest.importorskip("compressed_tensors")  # the GPU machine may lack it
    torch.manual_seed(4)
    weight = torch.randn(80, 128) * 0.05
    scheme = ct_scheme(fmt, bits=bits, sym=False if bits == 4 else True, strategy=strategy)
    tensors, w = make_compressed(weight, scheme)
    config = {"config_groups": {"g": scheme.model_dump(mode="json")}, "format": fmt}
    q = quant("compressed-tensors", config=config)
    return assemble(q, tensors), w


def fp8(kind):
    tensors, w = make_fp8(144, 192, kind)
    q = quant("fp8", config={"weight_block_size": [128, 128]} if kind == "scale_inv" else {})
    return assemble(q, tensors), w


def nf4():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(5)) * 0.1
    piece = quantize_codebook(w, "nf4", 64)
    return piece, piece.dequantize()


CASES = {
    "gptq4-g32-asym": lambda: gptq(4, 32, False),
    "gptq4-act-order": lambda: gptq(4, 32, False, act_order=True),
    "gptq8-per-channel-sym": lambda: gptq(8, -1, True),
    "gptq3-g64": lambda: gptq(3, 64, True),
    "awq": awq,
    "ct-w4a16": lambda: compressed("pack-quantized", 4, "group"),
    "ct-w8a8-int": lambda: compressed("int-quantized", 8, "channel"),
    "fp8-channel": lambda: fp8("channel"),
    "fp8-block": lambda: fp8("scale_inv"),
    "nf4": nf4,
}


def prepared(case):
    """(pieces as a layer packs them, W [N, K], the input permutation of act-order or None)."""
    piece, w = CASES[case]()
    if isinstance(piece, GroupIndexedWeight):
        sorted_piece, perm = piece.sort_groups()
        return [sorted_piece], w, perm
    return [piece], w, None


def check(actual, expected, dtype):
    scale = expected.abs().max().item()
    tol = TOLERANCE[dtype] * scale
    torch.testing.assert_close(actual.float(), expected, atol=tol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_and_reference_equal_x_times_w(device, case, dtype):
    pieces, w, perm = prepared(case)
    packed = pack_pieces(pieces, device)
    torch.manual_seed(6)
    x = torch.randn(5, w.shape[1])
    expected = x.to(dtype).float() @ w.t()  # [5, N]
    xp = x if perm is None else torch.nn.functional.pad(x, (0, 1))[:, perm]
    xd = xp.to(device=device, dtype=dtype)
    bias = torch.randn(w.shape[0]).to(device=device, dtype=dtype)
    check(triton_linear(xd, packed, None).cpu(), expected, dtype)
    check(torch_linear(xd, packed, None).cpu(), expected, dtype)
    check(triton_linear(xd, packed, bias).cpu(), expected + bias.float().cpu(), dtype)


def test_fp32_kernel_is_exact_on_integer_inputs(device):
    """Small integer activations and codes: every product and sum is exact in fp32, so the
    kernel (IEEE fp32 products) equals the float64 result exactly."""
    pieces, w, _ = prepared("gptq8-per-channel-sym")
    packed = pack_pieces(pieces, device)
    x = torch.randint(-3, 4, (3, w.shape[1])).float()
    expected = (x.double() @ packed.dequantize().cpu().double().t()).float()
    assert torch.equal(triton_linear(x.to(device), packed, None).cpu(), expected)


def test_a_rows_result_does_not_depend_on_its_batch(device):
    pieces, w, _ = prepared("gptq4-g32-asym")
    packed = pack_pieces(pieces, device)
    x = torch.randn(40, w.shape[1], dtype=torch.bfloat16, device=device)
    alone = triton_linear(x[7:8], packed, None)
    assert torch.equal(triton_linear(x, packed, None)[7:8], alone)
    assert torch.equal(triton_linear(x[:19], packed, None)[7:8], alone)


def test_fused_pieces_of_different_groups_share_one_layer(device):
    a, wa = gptq(4, 32, False)
    b, wb = gptq(4, 128, True)
    packed = pack_pieces([a, b], device)
    assert packed.group == 32 and packed.nibbles
    x = torch.randn(3, 128)
    expected = x @ torch.cat([wa, wb]).t()
    check(triton_linear(x.to(device), packed, None).cpu(), expected, torch.float32)
    assert torch.equal(packed.rows(torch.tensor([0, 100])).cpu(), torch.cat([wa, wb])[[0, 100]])


def test_ops_route_fp8_to_scaled_mm_only_where_it_runs(device):
    (piece,), _, _ = prepared("fp8-channel")
    (block,), _, _ = prepared("fp8-block")
    ops = CudaQuantOps(device, use_triton=True, scaled_mm=True)
    packed, packed_block = ops.pack([piece], "codebook"), ops.pack([block], "codebook")
    x = torch.randn(2, 192, dtype=torch.bfloat16, device=device)
    assert ops.takes_fp8(x, packed)
    assert not ops.takes_fp8(x.float(), packed)  # row-wise _scaled_mm: bfloat16 output only
    assert not ops.takes_fp8(x, packed_block)  # block scales: the dequantizing kernel
    assert not CudaQuantOps(device, scaled_mm=False).takes_fp8(x, packed)


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="torch._scaled_mm needs SM >= 8.9",
)
def test_fp8_scaled_mm_is_per_token_w8a8():
    w = torch.randn(256, 512) * 0.02
    packed = pack_pieces([quantize_fp8(w)], torch.device("cuda"))
    x = torch.randn(7, 512, device="cuda").bfloat16()
    bias = torch.randn(256, device="cuda").bfloat16()
    out = fp8_linear(x, packed, bias)
    expected = fp8_reference(x, packed, bias)
    check(out.cpu(), expected.cpu(), torch.bfloat16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's test (GPU: gpu tests)")
@pytest.mark.parametrize("fmt", ["gptq", "fp8"])
def test_prequantized_model_on_the_cuda_platform(fmt, tiny_model_factory, tmp_path):
    """A GPTQ (act-order) / FP8 block-wise checkpoint loads on the CUDA platform's layers (its
    QuantOps, the interpreter here) and gives the CPU runner's logits over a prefill and two
    decode steps (within bf16's tolerance)."""
    from backends.cuda.interpreted import InterpretedCudaPlatform
    from fixtures.prequantized import build_checkpoint
    from models.runner_utils import BlockAllocator, prompt, scheduled, step

    from pytgi.backends.cpu.platform import CpuPlatform
    from pytgi.config import DeviceConfig, EngineConfig, ModelConfig
    from pytgi.worker.model_runner import ModelRunner

    model_dir = tmp_path / fmt
    build_checkpoint(tiny_model_factory("llama", num_hidden_layers=1), model_dir, fmt)
    # bf16 on the CUDA platform (CUDA's quantized default dtypes; on CPU tensors fp32 dense
    # layers would take the CPU kernels' packing), fp32 on the CPU reference
    runners = [
        ModelRunner(EngineConfig(model=ModelConfig(model_id=str(model_dir), dtype=dtype)),
                    platform)  # fmt: skip
        for dtype, platform in (("bfloat16", InterpretedCudaPlatform()),
                                ("float32", CpuPlatform(DeviceConfig(kernels=False))))
    ]  # fmt: skip
    for runner in runners:
        runner.load_model(model_dir)
        runner.allocate_kv_cache(16)
    assert runners[0].model.model.layers[0].mlp.down_proj.quant_packed.format_name == "int4" or (
        fmt == "fp8"
    )
    ids = prompt(9, seed=1)
    table = BlockAllocator().take(16)
    for start in (0, 9, 10):
        work = step(scheduled("a", ids, start, len(ids), table, num_prompt=9))
        ours, expected = (r.forward(work).float() for r in runners)
        torch.testing.assert_close(ours, expected, atol=3e-2, rtol=3e-2)
        ids = ids + [int(expected[-1].argmax())]


def test_cuda_serves_the_weight_only_methods_in_the_model_dtype():
    from pytgi.errors import ConfigError
    from pytgi.layers.quantization.registry import (
        check_prequantized_options,
        resolve_quant_config,
    )

    gptq_quant = quant("gptq", bits=4, group_size=128)
    check_prequantized_options(gptq_quant, None, torch.float16, platform="cuda")
    with pytest.raises(ConfigError, match="float32"):
        check_prequantized_options(gptq_quant, None, torch.float16, platform="cpu")
    for name in ("fp8", "eetq", "bitsandbytes-nf4"):
        assert resolve_quant_config(name, None, torch.bfloat16, platform="cuda").name == name
    with pytest.raises(ConfigError, match="not supported on cuda"):
        resolve_quant_config("bitsandbytes", None, torch.float16, platform="cuda")
    with pytest.raises(ConfigError, match="CPU only"):
        resolve_quant_config("eetq", None, torch.float16, "int8", platform="cuda")
