"""Pre-quantized checkpoint tensors (GPTQ, AWQ, compressed-tensors, FP8) -> pytgi's pieces and
layers: each weight equals the format's own dequantisation bit for bit, the layers' outputs
equal x @ W^T (fused q/k/v shards, act-order, tensor-parallel shards on group boundaries), each
output row is independent of the batch, and what pytgi cannot serve is refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from fixtures.prequantized import ct_scheme, make_awq, make_compressed, make_fp8, make_gptq

from pytgi.distributed.parallel_state import TPInfo
from pytgi.errors import ConfigError, ModelLoadError
from pytgi.layers.build_context import build_context, current_build_context
from pytgi.layers.linear import QKVParallelLinear, RowParallelLinear
from pytgi.layers.quantization.base import QuantConfig
from pytgi.layers.quantization.detect import (
    CheckpointQuant,
    check_checkpoint_quant,
    read_checkpoint_quant,
)
from pytgi.layers.quantization.int_packing import pack_stream, unpack_stream
from pytgi.layers.quantization.prequantized import PrequantizedLinearMethod, PrequantizedTensors
from pytgi.layers.quantization.prequantized_formats import format_for


def as_rank(rank: int, world_size: int):
    """Layers built inside are that rank's shard (this process is one rank: the collectives are
    identities and the tests combine the shards)."""
    return build_context(replace(current_build_context(), tp=TPInfo(rank, world_size)))


def quant(method, **kw) -> CheckpointQuant:
    return CheckpointQuant(method=method, source="test", **kw)


def assemble(q: CheckpointQuant, tensors: dict):
    """The piece PrequantizedTensors hands the layers for one module's tensors."""
    names = [f"m.{k}" for k in tensors]
    stream = PrequantizedTensors(format_for(q), names).tensors(
        (f"m.{k}", v) for k, v in tensors.items()
    )
    ((name, piece),) = list(stream)
    assert name == "m.weight"
    return piece


class _Config(QuantConfig):
    name = "test"

    def get_linear_method(self, prefix, ops):
        return PrequantizedLinearMethod(ops, "test")


def row_layer(piece, k, n):
    layer = RowParallelLinear(k, n, quant_config=_Config())
    layer.weight.weight_loader(layer.weight, piece)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def assert_layer_matches(layer, w, k):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, k, generator=g)
    y = layer(x)
    expected = x.double() @ w.double().t()
    assert ((y.double() - expected).abs().max() / expected.abs().max()) < 1e-5


def test_bit_streams_round_trip():
    g = torch.Generator().manual_seed(0)
    for bits in range(1, 9):
        v = torch.randint(0, 2**bits, (5, 64), generator=g)
        assert torch.equal(unpack_stream(pack_stream(v, bits, 1), bits, 64, 1).long(), v)
        assert torch.equal(unpack_stream(pack_stream(v.t(), bits, 0), bits, 64, 0).long(), v.t())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group,v2", [(32, False), (128, True), (-1, False)])
def test_gptq_weights_are_the_formats_dequantisation(bits, sym, group, v2, cpu_kernels):
    tensors, w = make_gptq(96, 256, bits, group, sym, v2=v2)
    fmt = "gptq_v2" if v2 else "gptq"
    piece = assemble(quant("gptq", bits=bits, group_size=group, checkpoint_format=fmt), tensors)
    assert torch.equal(piece.dequantize(), w)
    layer = row_layer(piece, 256, 96)
    assert torch.equal(layer.quant_packed.dequantize()[:96], w)  # packed losslessly
    assert_layer_matches(layer, w, 256)


def test_gptq_group_not_dividing_inputs(cpu_kernels):
    """576 inputs (SmolLM2) in groups of 128: the last group holds 64."""
    tensors, w = make_gptq(64, 576, 4, 128, sym=False)
    piece = assemble(quant("gptq", bits=4, group_size=128), tensors)
    assert torch.equal(piece.dequantize(), w)
    assert_layer_matches(row_layer(piece, 576, 64), w, 576)


@pytest.mark.parametrize("bits", [4, 3])
def test_gptq_act_order_fused_and_sharded(bits, cpu_kernels):
    """desc_act: one g_idx (a permutation of the groups) shared by q/k/v; a row-parallel shard
    of it splits groups anywhere and still computes its part exactly."""
    k, group = 128, 32
    g_idx = torch.randperm(k, generator=torch.Generator().manual_seed(3)) // group
    parts = [make_gptq(n, k, bits, group, sym=False, g_idx=g_idx, seed=s)
             for s, n in enumerate((64, 32, 32))]  # fmt: skip
    q = quant("gptq", bits=bits, group_size=group, desc_act=True)
    qkv = QKVParallelLinear(k, 16, 4, 2, quant_config=_Config())
    for shard_id, (tensors, _) in zip("qkv", parts, strict=True):
        qkv.weight.weight_loader(qkv.weight, assemble(q, tensors), shard_id)
    qkv.quant_method.process_weights_after_loading(qkv)
    w = torch.cat([p[1] for p in parts])
    assert_layer_matches(qkv, w, k)
    tensors, w = parts[0]
    x = torch.randn(3, k)
    total = 0
    for rank in range(2):
        with as_rank(rank, 2):
            layer = row_layer(assemble(q, tensors), k, 64)
        total = total + layer.quant_method.apply(layer, x[:, 64 * rank : 64 * rank + 64])
    torch.testing.assert_close(total, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_awq_gemm_packing(cpu_kernels):
    tensors, w = make_awq(64, 256, 128)
    piece = assemble(quant("awq", bits=4, group_size=128), tensors)
    assert torch.equal(piece.dequantize(), w)
    assert_layer_matches(row_layer(piece, 256, 64), w, 256)


def test_row_parallel_shards_split_on_group_boundaries(cpu_kernels):
    tensors, w = make_gptq(64, 256, 4, 64, sym=False)
    q = quant("gptq", bits=4, group_size=64)
    x = torch.randn(3, 256)
    total = 0
    for rank in range(2):
        with as_rank(rank, 2):
            layer = row_layer(assemble(q, tensors), 256, 64)
        total = total + layer.quant_method.apply(layer, x[:, 128 * rank : 128 * rank + 128])
    torch.testing.assert_close(total, x @ w.t(), rtol=1e-5, atol=1e-5)
    with as_rank(0, 8), pytest.raises(ModelLoadError, match="not block-aligned"):  # 32 per rank
        row_layer(assemble(q, tensors), 256, 64)


CT_CASES = {
    "w4a16-sym-g32": dict(fmt="pack-quantized", bits=4, group=32),
    "w4a16-asym-g64": dict(fmt="pack-quantized", bits=4, sym=False, group=64),
    "w8a16-channel": dict(fmt="pack-quantized", bits=8, strategy="channel"),
    "w8a16-asym-g32-bf16": dict(fmt="pack-quantized", bits=8, sym=False, group=32),
    "w8a8-int-dynamic": dict(fmt="int-quantized", bits=8, strategy="channel", dynamic_acts=1),
    "w8-naive-tensor": dict(fmt="naive-quantized", bits=8, strategy="tensor"),
    "fp8-channel": dict(fmt="float-quantized", bits=8, kind="float", strategy="channel"),
    "fp8-tensor": dict(fmt="float-quantized", bits=8, kind="float", strategy="tensor"),
    "fp8-block": dict(
        fmt="float-quantized", bits=8, kind="float", strategy="block", block=[128, 128]
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", CT_CASES)
def test_compressed_tensors_from_the_librarys_compressors(case, cpu_kernels):
    """The library compresses a random weight; pytgi's weight equals the library's own
    decompression, and the layer multiplies by it."""
    options = CT_CASES[case]
    scheme = ct_scheme(**options)
    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(2)) * 0.05
    if case.endswith("bf16"):  # llm-compressor's usual scales: the model's bfloat16
        weight = weight.bfloat16()
    compressed, decompressed = make_compressed(weight, scheme)
    config = {"config_groups": {"group_0": scheme.model_dump()}, "format": options["fmt"]}
    piece = assemble(quant("compressed-tensors", config=config), compressed)
    assert torch.equal(piece.dequantize(), decompressed)
    assert_layer_matches(row_layer(piece, 256, 256), decompressed, 256)


@pytest.mark.parametrize("kind", ["tensor", "channel", "block", "scale_inv"])
def test_fp8_checkpoints(kind, cpu_kernels):
    """llm-compressor / fbgemm / DeepSeek FP8: e4m3 times a per-tensor, per-row or 128x128
    block scale (a 200x320 weight: partial blocks on both edges)."""
    tensors, w = make_fp8(200, 320, kind)
    config = {"weight_block_size": [128, 128]} if kind == "scale_inv" else {}
    if kind == "block":  # llm-compressor's FP8_BLOCK: weight_scale per 128x128 tile
        piece = assemble(quant("compressed-tensors", config={}), tensors)
    else:
        piece = assemble(quant("fp8", config=config), {**tensors, "input_scale": torch.ones(1)})
    assert torch.equal(piece.dequantize(), w)
    assert_layer_matches(row_layer(piece, 320, 200), w, 320)


def test_module_parts_are_gathered_across_the_stream():
    """Parts of one module arriving apart (other tensors between, another shard file) become
    one `.weight`; norms, biases, an unquantized head and KV scales pass through (the loader
    gives the KV scales to the attention layers); q_scale is dropped."""
    tensors, _ = make_gptq(64, 64, 4, 32, sym=True)
    stream = [("a.qweight", tensors["qweight"]), ("norm.weight", torch.ones(4)),
              ("a.bias", torch.zeros(64)), ("a.scales", tensors["scales"]),
              ("lm_head.weight", torch.ones(2, 2)), ("attn.k_scale", torch.ones(1)),
              ("attn.q_scale", torch.ones(1)),
              ("a.qzeros", tensors["qzeros"]), ("a.g_idx", tensors["g_idx"])]  # fmt: skip
    pre = PrequantizedTensors(format_for(quant("gptq", group_size=32)), [n for n, _ in stream])
    assert pre.modules == {"a"}
    assert pre.names() == ["a.weight", "norm.weight", "a.bias", "lm_head.weight", "attn.k_scale"]
    assert [n for n, _ in pre.tensors(stream)] == ["norm.weight", "a.bias", "lm_head.weight",
                                                   "attn.k_scale", "a.weight"]  # fmt: skip


def write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def test_detection_as_tgi_reads_it(tmp_path):
    write(tmp_path, "config.json", {"architectures": ["LlamaForCausalLM"]})
    assert read_checkpoint_quant(tmp_path) is None
    write(tmp_path, "quant_config.json", {"w_bit": 4, "q_group_size": 64, "zero_point": True,
                                          "version": "GEMM"})  # fmt: skip
    q = read_checkpoint_quant(tmp_path)
    assert (q.method, q.bits, q.group_size, q.sym) == ("awq", 4, 64, False)
    write(tmp_path, "quantize_config.json", {"bits": 8, "group_size": 128, "desc_act": True})
    q = read_checkpoint_quant(tmp_path)
    assert (q.method, q.bits, q.group_size, q.desc_act) == ("gptq", 8, 128, True)
    write(tmp_path, "config.json", {"compression_config": {"quant_method": "compressed-tensors"}})
    assert read_checkpoint_quant(tmp_path).method == "compressed-tensors"
    write(tmp_path, "config.json", {"quantization_config": {"quant_method": "fbgemm_fp8"}})
    assert read_checkpoint_quant(tmp_path).method == "fp8"


REFUSED = {
    "exl2": ({"quant_method": "exl2"}, "EXL2 checkpoints are not supported"),
    "bnb": ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes-serialized"),
    "marlin-gptq": ({"quant_method": "gptq", "checkpoint_format": "marlin"}, "'marlin' format"),
    "awq-gemv": ({"quant_method": "awq", "version": "gemv"}, "version 'gemv'"),
    "marlin-24": ({"quant_method": "compressed-tensors", "format": "marlin-24",
                   "config_groups": {"g": {"weights": {"num_bits": 4}}}}, "'marlin-24'"),
    "nvfp4": ({"quant_method": "compressed-tensors",
               "config_groups": {"g": {"format": "nvfp4-pack-quantized"}}}, "nvfp4-pack"),
    "unfinished": ({"quant_method": "compressed-tensors", "quantization_status": "calibration"},
                   "Model quantization was not finished, status was: calibration"),
    "unknown": ({"quant_method": "foo"}, "checkpoints quantized with 'foo' are not supported"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_unsupported_methods_are_refused_in_one_line(case, tmp_path):
    config, message = REFUSED[case]
    write(tmp_path, "config.json", {"quantization_config": config})
    with pytest.raises(ConfigError, match=message) as err:
        check_checkpoint_quant(read_checkpoint_quant(tmp_path), None)
    assert "\n" not in str(err.value)


def test_quantize_flag_must_agree():
    q = quant("gptq")
    assert check_checkpoint_quant(q, "gptq") == "gptq"
    assert check_checkpoint_quant(q, "marlin") == "gptq"  # TGI repacks GPTQ for --quantize marlin
    with pytest.raises(ConfigError, match="--quantize awq does not match"):
        check_checkpoint_quant(q, "awq")


def test_a_rows_result_does_not_depend_on_its_batch():
    """docs/KERNELS.md's row invariance, for an act-order layer (its gather included)."""
    from pytgi.backends.cpu import kernels
    from pytgi.backends.cpu.quant_ops import CpuQuantOps

    g_idx = torch.randperm(256, generator=torch.Generator().manual_seed(1)) // 32
    tensors, _ = make_gptq(96, 256, 4, 32, sym=False, g_idx=g_idx)
    piece = assemble(quant("gptq", bits=4, group_size=32), tensors)
    layer = RowParallelLinear(256, 96, quant_config=_Config())
    layer.quant_method.ops = CpuQuantOps(kernels.load_cpu_kernels())
    layer.weight.weight_loader(layer.weight, piece)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(13, 256)
    y = layer(x)
    for m in (1, 2, 5, 9):
        assert torch.equal(layer(x[:m]), y[:m])
