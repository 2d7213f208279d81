"""The quantized LinearMethods inside the parallel linear layers and the LM head: shards load
through the layers' own weight loaders (float tensors quantised on arrival, or pre-quantized
QuantizedWeights), fused q/k/v and gate/up shards pack into one kernel layout, tensor-parallel
ranks (simulated, as in test_linear.py; the real gloo run is in test_tp.py) combine to the
unsharded result, a tied embedding dequantises its rows, and the registry refuses what it cannot
run. Each case runs on the compiled kernels and on the pure-torch path."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from pytgi.backends.cpu import kernels
from pytgi.backends.cpu.quant_ops import int8_acts_reference
from pytgi.distributed import parallel_state
from pytgi.distributed.parallel_state import TPInfo
from pytgi.errors import ConfigError, ModelLoadError
from pytgi.layers.build_context import BuildContext, build_context, current_build_context
from pytgi.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from pytgi.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pytgi.layers.quantization.cpu_methods import Int4LinearMethod, Int8LinearMethod
from pytgi.layers.quantization.packed import FP32_ACTIVATIONS, ActivationPolicy
from pytgi.layers.quantization.quantizers import (
    quantize_codebook,
    quantize_fp8,
    quantize_per_channel_int8,
    quantize_q4_0,
    quantize_q8_0,
)
from pytgi.layers.quantization.registry import (
    INT8_POLICY,
    SUPPORTED_QUANTIZE,
    OnTheFlyQuantConfig,
    quant_config_for,
    resolve_quant_config,
)

QUANTIZERS = {  # --quantize name -> the quantiser its method applies to a float weight
    "eetq": quantize_per_channel_int8,
    "bitsandbytes": quantize_per_channel_int8,
    "bitsandbytes-nf4": lambda w: quantize_codebook(w, "nf4"),
    "bitsandbytes-fp4": lambda w: quantize_codebook(w, "fp4"),
    "fp8": quantize_fp8,
}


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


@pytest.fixture
def as_rank(monkeypatch):
    """Layers built after `set_rank(rank, world_size)` are that rank's shard. The process itself
    is one rank, so the collectives are identities and the test combines the shards."""
    monkeypatch.setattr(parallel_state, "_TP_INFO", TPInfo(0, 1))
    with ExitStack() as stack:

        def set_rank(rank: int, world_size: int) -> None:
            context = replace(current_build_context(), tp=TPInfo(rank, world_size))
            stack.enter_context(build_context(context))

        yield set_rank


def load(layer, tensor, shard_id=None) -> None:
    param = layer.weight
    if shard_id is None:
        param.weight_loader(param, tensor)
    else:
        param.weight_loader(param, tensor, shard_id)


def finish(layer) -> None:
    layer.quant_method.process_weights_after_loading(layer)


def assert_output(layer, x, dense, bias=None):
    """The layer's output against x @ dense^T: exact weights with fp32 activations; with int8
    activations, the float64 reference of the same quantised activations."""
    y = layer(x).double()
    method = layer.quant_method
    if method.ops.compiled and method.policy.int8_acts(x.shape[0]):
        expected = int8_acts_reference(x, layer.quant_packed)
    else:
        expected = x.double() @ dense.double().t()
    if bias is not None:
        expected = expected + bias.double()
    assert ((y - expected).abs().max() / expected.abs().max()) < 1e-5


@pytest.mark.parametrize("name", SUPPORTED_QUANTIZE)
def test_on_the_fly_qkv_and_gate_up(name, cpu_kernels):
    config = quant_config_for(name)
    g = torch.Generator().manual_seed(0)
    wq, wk, wv = (torch.randn(n, 64, generator=g) * 0.1 for n in (64, 32, 32))
    qkv = QKVParallelLinear(64, 16, 4, 2, bias=True, quant_config=config)
    for shard_id, w in zip("qkv", (wq, wk, wv), strict=True):
        load(qkv, w, shard_id)
    bias = torch.randn(128, generator=g)
    qkv.weight_loader(qkv.bias, bias[:64], "q")
    qkv.weight_loader(qkv.bias, bias[64:96], "k")
    qkv.weight_loader(qkv.bias, bias[96:], "v")
    finish(qkv)
    dense = torch.cat([QUANTIZERS[name](w).dequantize() for w in (wq, wk, wv)])
    assert torch.equal(qkv.quant_packed.dequantize()[:128], dense)  # shards packed exactly
    assert qkv.weight.numel() == 0  # no float copy kept
    for m in (1, 5, 17):
        assert_output(qkv, torch.randn(m, 64, generator=g), dense, bias)
    gate, up = torch.randn(96, 64, generator=g), torch.randn(96, 64, generator=g)
    gate_up = MergedColumnParallelLinear(64, [96, 96], quant_config=config)
    load(gate_up, up, 1)  # any order
    load(gate_up, gate, 0)
    finish(gate_up)
    dense = torch.cat([QUANTIZERS[name](w).dequantize() for w in (gate, up)])
    assert_output(gate_up, torch.randn(3, 64, generator=g), dense)


def test_prequantized_pieces_and_tensor_parallel_shards(as_rank, cpu_kernels):
    """Q4_0 / Q8_0 QuantizedWeights through 2 simulated ranks: column shards exact, row shards
    block-aligned; the ranks' outputs combine to the unsharded product."""
    g = torch.Generator().manual_seed(1)
    gate, up = (
        quantize_q4_0(torch.randn(64, 128, generator=g)),
        quantize_q4_0(torch.randn(64, 128, generator=g)),
    )
    down = quantize_q8_0(torch.randn(64, 128, generator=g))  # [out 64, in 128]
    x = torch.randn(4, 128, generator=g)
    policy = ActivationPolicy(int8_from_rows=None)  # exact products: the ranks must combine

    def config(method):
        return OnTheFlyQuantConfig("test", lambda kernels: method(kernels, policy))

    full = F.linear(x, torch.cat([gate.dequantize(), up.dequantize()]))  # [4, 128]
    parts, reduced = [], 0
    for rank in range(2):
        as_rank(rank, 2)
        gate_up = MergedColumnParallelLinear(128, [64, 64], quant_config=config(Int4LinearMethod))
        load(gate_up, gate, 0)
        load(gate_up, up, 1)
        finish(gate_up)
        parts.append(gate_up(x))  # [4, 64]: this rank's halves of gate and up
        down_proj = RowParallelLinear(128, 64, quant_config=config(Int8LinearMethod))
        load(down_proj, down)  # each rank keeps its 64 input features (2 blocks)
        finish(down_proj)
        reduced = reduced + down_proj.quant_method.apply(
            down_proj, x[:, 64 * rank : 64 * rank + 64]
        )
    halves = [p.chunk(2, dim=1) for p in parts]
    combined = torch.cat([halves[0][0], halves[1][0], halves[0][1], halves[1][1]], dim=1)
    torch.testing.assert_close(combined, full, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(reduced, x @ down.dequantize().t(), rtol=1e-5, atol=1e-4)
    as_rank(0, 2)
    misaligned = RowParallelLinear(96, 8, quant_config=config(Int8LinearMethod))
    with pytest.raises(ModelLoadError, match="not block-aligned"):
        load(misaligned, quantize_q8_0(torch.randn(8, 96)))  # 48-wide shards of 32-blocks


def _llm_int8_layer(ops, w, name="bitsandbytes", policy=None):
    with build_context(BuildContext(kernels=ops)):
        layer = RowParallelLinear(64, 24, quant_config=quant_config_for(name, policy))
    load(layer, w)
    finish(layer)
    return layer


def test_llm_int8_outliers_of_each_row_run_in_fp32(ops):
    w = torch.randn(24, 64) * 0.1
    layer = _llm_int8_layer(ops, w)
    x = torch.randn(3, 64)
    x[1, 10], x[0, 33], x[0, 34] = 9.0, -7.5, 6.0  # each row's own outliers (|x| >= 6)
    dense = quantize_per_channel_int8(w).dequantize()
    mask = x.abs() >= 6.0
    expected = int8_acts_reference(x.masked_fill(mask, 0.0), layer.quant_packed)
    expected += (x * mask).double() @ dense.double().t()  # row 2 has none: all int8
    y = layer(x).double()
    assert ((y - expected).abs().max() / expected.abs().max()) < 1e-5
    other = _llm_int8_layer(ops, w, "eetq", INT8_POLICY)  # no threshold: outliers through int8
    exact = x.double() @ dense.double().t()
    assert (y - exact).abs().max() < (other(x).double() - exact).abs().max()


def test_llm_int8_rows_do_not_depend_on_their_neighbours(ops):
    """Planted outliers in other rows (bitsandbytes would take those features out of every row's
    int8 product): each row's output is bit for bit its output alone."""
    g = torch.Generator().manual_seed(5)
    layer = _llm_int8_layer(ops, torch.randn(24, 64, generator=g) * 0.1)
    x = torch.randn(6, 64, generator=g)
    for row, col in [(0, 3), (1, 40), (2, 3), (2, 41), (4, 63)]:
        x[row, col] = 8.0 * (1 if col % 2 else -1)
    batch = layer(x)
    for row in range(6):
        assert torch.equal(batch[row], layer(x[row : row + 1])[0]), row
        assert torch.equal(batch[row], layer(x[[row, (row + 1) % 6, (row + 3) % 6]])[0]), row


def test_default_activations_are_tgis(ops):
    """eetq and NF4 / FP4 are weight-only in TGI (exact products with the dequantised weights),
    LLM.int8 quantizes its activations; int8 stays an opt-in where it keeps the format's values."""
    from pytgi.layers.quantization.registry import activation_policy

    assert activation_policy("eetq") == FP32_ACTIVATIONS
    assert activation_policy("bitsandbytes-nf4") == FP32_ACTIVATIONS
    assert activation_policy("bitsandbytes") == INT8_POLICY
    assert activation_policy("gguf") == INT8_POLICY
    assert activation_policy("eetq", "int8") == INT8_POLICY
    assert activation_policy("bitsandbytes", "fp32") == FP32_ACTIVATIONS
    with pytest.raises(ConfigError, match="not available with --quantize bitsandbytes-fp4"):
        activation_policy("bitsandbytes-fp4", "int8")
    w = torch.randn(24, 64) * 0.1
    x = torch.randn(2, 64)
    exact = x.double() @ quantize_per_channel_int8(w).dequantize().double().t()
    eetq = _llm_int8_layer(ops, w, "eetq")
    assert ((eetq(x).double() - exact).abs().max() / exact.abs().max()) < 1e-6


@pytest.mark.parametrize("world_size", [1, 2])
def test_quantized_lm_head_and_tied_embedding(as_rank, cpu_kernels, world_size):
    g = torch.Generator().manual_seed(2)
    weight, ids, hidden = (
        torch.randn(41, 64, generator=g),
        torch.tensor([0, 5, 20, 21, 40]),
        torch.randn(3, 64, generator=g),
    )
    dense = quantize_per_channel_int8(weight).dequantize()
    logits, rows = [], 0
    for rank in range(world_size):
        as_rank(rank, world_size)
        config = OnTheFlyQuantConfig(
            "int8",
            lambda k: Int8LinearMethod(k, FP32_ACTIVATIONS, quantize_per_channel_int8),
            quantize_lm_head=True,
        )
        emb, head = VocabParallelEmbedding(41, 64), ParallelLMHead(41, 64, quant_config=config)
        head.tie(emb)
        emb.weight.weight_loader(emb.weight, weight)  # the checkpoint's embedding loads the head
        head.process_weights_after_loading()
        local = head._local_logits(hidden)  # [3, padded local vocab]
        assert local.shape[1] == head.num_local
        logits.append(local[:, : head.vocab_end - head.vocab_start])
        is_local = (ids >= head.vocab_start) & (ids < head.vocab_end)
        found = emb._rows((ids - emb.vocab_start) * is_local).masked_fill(~is_local.unsqueeze(1), 0)
        rows = rows + found
    torch.testing.assert_close(torch.cat(logits, 1), hidden @ dense.t(), rtol=1e-5, atol=1e-5)
    assert torch.equal(rows, dense[ids])


def test_missing_rows_and_registry_errors(cpu_kernels):
    layer = MergedColumnParallelLinear(64, [32, 32], quant_config=quant_config_for("eetq"))
    load(layer, torch.randn(32, 64), 0)
    with pytest.raises(ModelLoadError, match="32 output rows were never loaded"):
        finish(layer)
    with pytest.raises(ConfigError, match="--quantize gptq is not supported on CPU"):
        quant_config_for("gptq")
    with pytest.raises(ConfigError, match="--dtype float32"):
        resolve_quant_config("eetq", None, torch.bfloat16)
    with pytest.raises(ConfigError, match="quantized with 'awq'"):
        resolve_quant_config(None, "awq", torch.float32)
    assert resolve_quant_config(None, None, torch.float32) is None
    assert resolve_quant_config("fp8", None, torch.float32).name == "fp8"
