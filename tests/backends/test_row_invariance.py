"""The row-invariance contract (docs/KERNELS.md): a row's output is a function of that row alone.
The same input row gives the same bits whether its step carries 1 row or many, and whatever the
step's phase (a decode row, the k+1 rows of a verify, a chunk of a prefill). Every linear kernel
runs here: fp32 (packed tiles and the torch path), and each quantized format with int8 and fp32
activations, at row counts on both sides of every path switch (register / panel kernels, row
chunks). New kernels add themselves to `LINEARS`.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.gguf_files import random_blocks
from gguf import GGMLQuantizationType

from pytgi.backends.cpu import kernels
from pytgi.backends.cpu.kquant_layout import pack_kquant
from pytgi.backends.cpu.platform import CpuPlatform
from pytgi.backends.cpu.quant_layout import FP8
from pytgi.backends.cpu.quant_ops import CpuQuantOps
from pytgi.backends.cpu.quant_packing import pack_codebook, pack_quantized
from pytgi.config import DeviceConfig
from pytgi.layers.quantization.quantizers import (
    quantize_codebook,
    quantize_fp8,
    quantize_per_channel_int8,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
)
from pytgi.layers.quantization.unquantized import pack_column_tiles, packed_matmul
from pytgi.models.gguf.blocks import decode_blocks

# row counts: decode (1), verify (2-5 with --speculate 1-4), the register / panel switch of the
# fp32-activation kernels (8, 9), prefill chunks, and past the int8 kernels' 64-row chunk
ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 64, 70)
# a partial 16-column tile and a K of three 32-blocks; 5 groups of 8 columns: the AVX-512 table
# runs pairs of groups on zmm and the odd one on ymm
N, K = 40, 96

QUANTIZED = {
    "Q8_0": lambda w: pack_quantized([quantize_q8_0(w)]),
    "Q4_0": lambda w: pack_quantized([quantize_q4_0(w)]),
    "Q4_1": lambda w: pack_quantized([quantize_q4_1(w)]),
    "per-channel int8": lambda w: pack_quantized([quantize_per_channel_int8(w)], "int8"),
    "nf4": lambda w: pack_codebook(quantize_codebook(w, "nf4")),
    "fp4": lambda w: pack_codebook(quantize_codebook(w, "fp4")),
    "fp8": lambda w: pack_codebook(quantize_fp8(w)),
}


# the native K-quant kernels (GGUF Q4_K / Q6_K, 256-wide super-blocks) and a fused layer mixing them
KQUANT_N, KQUANT_K = 40, 256


def _kquant(types: list[GGMLQuantizationType]):
    pieces = [
        decode_blocks(random_blocks(t, KQUANT_N // len(types), KQUANT_K, seed=i), t, "w")
        for i, t in enumerate(types)
    ]
    return pack_kquant(pieces)


KQUANTS = {
    "Q4_K": lambda: _kquant([GGMLQuantizationType.Q4_K]),
    "Q6_K": lambda: _kquant([GGMLQuantizationType.Q6_K]),
    "Q4_K+Q6_K": lambda: _kquant([GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K]),
}


@pytest.fixture(scope="module")
def ops():
    module = kernels.load_cpu_kernels()
    assert module is not None, "the CPU kernels failed to build"
    return module


def _inputs(seed: int = 0, k: int = K) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(N, k, generator=g) * 0.1, torch.randn(max(ROWS), k, generator=g)


def assert_row_invariant(linear, k: int = K) -> None:
    """`linear(x [M, K]) -> [M, N]`: every row of every M equals that row computed alone."""
    _, x = _inputs(k=k)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])
    for m in ROWS:
        for offset in (0, max(ROWS) - m):  # the same rows at other places in the step
            rows = linear(x[offset : offset + m])
            same = (rows == alone[offset : offset + m]).all(dim=1)
            assert bool(same.all()), f"M={m}: rows {(~same).nonzero().flatten().tolist()} differ"


def test_fp32_packed_tiles(ops):
    w, _ = _inputs()
    packed = pack_column_tiles(w)
    bias = torch.randn(packed.shape[0] * packed.shape[2])
    assert_row_invariant(lambda x: packed_matmul(x, packed, bias, ops))


@pytest.mark.parametrize("acts", ["int8", "fp32"])
@pytest.mark.parametrize("name", list(QUANTIZED))
def test_quantized_kernels(ops, name, acts):
    w, _ = _inputs()
    packed = QUANTIZED[name](w)
    if acts == "int8" and packed.format == FP8:
        pytest.skip("fp8 has no int8-activation kernel")
    bias = torch.randn(N)
    assert_row_invariant(lambda x: CpuQuantOps(ops).linear(x, packed, bias, acts == "int8"))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_every_table_forced_through_the_platform(ops, name):
    """Each kernel table the CPU has (AVX-512 VNNI's zmm pairs of groups, AVX2, scalar), chosen
    as the platform chooses it at start-up (DeviceConfig.quant_isa), keeps rows invariant, on
    one thread and on two (the threads split the groups at any group, odd ones included)."""
    w, _ = _inputs()
    packed = QUANTIZED[name](w)
    bias = torch.randn(N)
    threads = torch.get_num_threads()
    try:
        for isa in ops.quant_isas():
            quant_ops = CpuPlatform(DeviceConfig(quant_isa=isa)).quant_ops(torch.float32)
            assert quant_ops.isa == isa
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                assert_row_invariant(lambda x, q=quant_ops: q.linear(x, packed, bias, True))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("acts", ["int8", "fp32"])
@pytest.mark.parametrize("name", list(KQUANTS))
def test_kquant_kernels(ops, name, acts):
    packed = KQUANTS[name]()
    bias = torch.randn(KQUANT_N)
    linear = CpuQuantOps(ops).linear
    assert_row_invariant(lambda x: linear(x, packed, bias, acts == "int8"), KQUANT_K)


def test_kquant_every_table_forced_through_the_platform(ops):
    """The native K-quant int8 kernels (both formats: a fused Q4_K + Q6_K layer) on each table
    the CPU has, forced as the platform forces it at start-up, on one thread and on two."""
    packed = KQUANTS["Q4_K+Q6_K"]()
    bias = torch.randn(KQUANT_N)
    threads = torch.get_num_threads()
    try:
        for isa in ops.quant_isas():
            quant_ops = CpuPlatform(DeviceConfig(quant_isa=isa)).quant_ops(torch.float32)
            assert quant_ops.isa == isa
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                assert_row_invariant(
                    lambda x, q=quant_ops: q.linear(x, packed, bias, True), KQUANT_K
                )
    finally:
        torch.set_num_threads(threads)


def test_decode_attention_rows(ops):
    """The paged decode kernel (decode rows, and verify rows run as decode rows): each row against
    its own keys gives the same bits alone and among others of other lengths."""
    g = torch.Generator().manual_seed(3)
    kv_heads, heads, d, bs, blocks = 2, 4, 32, 16, 24
    k_cache = torch.randn(kv_heads, blocks * bs, d, generator=g)
    v_cache = torch.randn(kv_heads, blocks * bs, d, generator=g)
    rows = 7
    q = torch.randn(rows, heads, d, generator=g)
    tables = torch.randperm(blocks, generator=g)[: rows * 3].view(rows, 3).to(torch.int64)
    seq_lens = torch.tensor([1, 5, 16, 17, 30, 33, 48], dtype=torch.int64)
    first = torch.zeros(rows, dtype=torch.int64)

    def attend(idx: list[int]) -> torch.Tensor:
        return ops.decode_attention(
            q[idx].contiguous(), k_cache, v_cache, tables[idx].contiguous(), first[idx],
            seq_lens[idx], bs, d**-0.5, 0.0, None,
        )  # fmt: skip

    together = attend(list(range(rows)))
    for i in range(rows):
        assert torch.equal(together[i], attend([i])[0]), i
        assert torch.equal(together[i], attend([i, (i + 3) % rows])[0]), i


def _moe_block(ops):
    """A Qwen2-MoE-shaped block (6 experts, top-2, not renormalised, a gated shared expert) built
    with the kernels and packed as the loader packs it."""
    from pytgi.layers.build_context import BuildContext, build_context
    from pytgi.layers.moe.block import SparseMoeBlock
    from pytgi.layers.moe.config import MoEConfig

    moe = MoEConfig(
        num_experts=6, top_k=2, intermediate_size=24, renormalize=False,
        shared_intermediate_size=40, shared_expert_gate=True,
    )  # fmt: skip
    with build_context(BuildContext(kernels=ops)):
        block = SparseMoeBlock(moe, K, None, "mlp")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    for module in block.modules():
        if hasattr(module, "quant_method"):
            module.quant_method.process_weights_after_loading(module)
        elif hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    assert block.experts.w13_packed is not None and block.gate.weight_packed is not None
    return block


@torch.no_grad()
def test_moe_block_rows(ops):
    """The MoE MLP (router, grouped experts, shared expert) on the packed kernels: a row's output
    alone equals its output in a step of 8 rows, where other rows share its experts."""
    block = _moe_block(ops)
    x = torch.randn(8, K, generator=torch.Generator().manual_seed(6))
    together = block(x)
    for i in range(8):
        assert torch.equal(together[i], block(x[i : i + 1])[0]), i


def test_fused_moe_decode_rows(ops, tiny_model_factory):
    """The fused decode stack's MoE layers (Mixtral): each of 8 decode rows gives the same logits
    alone as in the step of 8."""
    from models.runner_utils import BlockAllocator, make_runner, prompt, scheduled, step
    from models.test_decoder_stack import counting_runs

    runner = make_runner(tiny_model_factory("mixtral"), num_blocks=64)
    assert runner.accelerator is not None
    runs = counting_runs(runner, pytest.MonkeyPatch())
    blocks = BlockAllocator()
    seqs = [(prompt(n, seed=n), blocks.take(n + 4), n) for n in (2, 5, 9, 12, 17, 20, 26, 31)]
    runner.forward(step(*(scheduled(f"r{i}", ids, 0, n, t) for i, (ids, t, n) in enumerate(seqs))))
    seqs = [(ids + [7], table, n) for ids, table, n in seqs]

    def decode(idx: list[int]) -> torch.Tensor:
        return runner.forward(
            step(
                *(
                    scheduled(f"r{i}", seqs[i][0], seqs[i][2], seqs[i][2] + 1, seqs[i][1],
                              num_prompt=seqs[i][2])
                    for i in idx
                )
            )
        )  # fmt: skip

    together = decode(list(range(8)))
    for i in range(8):
        assert torch.equal(together[i], decode([i])[0]), i
    assert runs == [False] + [True] * 9  # the prefill, then every decode step ran fused


# the KV cache formats the compiled attention kernels read in place (every --kv-cache-dtype)
KV_FORMATS = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
              torch.float8_e5m2, torch.int8)  # fmt: skip
SEQ = 150  # three 64-key blocks, the last one partial
BS = 16


def _attention_inputs(d: int, kv_dtype: torch.dtype, k_scale: float, v_scale: float):
    """A 150-token sequence of 2 KV heads (4 query heads) in a scattered block table, stored
    through the kernel's store_kv in `kv_dtype`: (q [SEQ, 4, d], k, v [SEQ, 2, d] fp32 as
    stored, caches, table [W])."""
    from pytgi.backends.cpu.attention import INT8_KV_SCALE_BYTES

    g = torch.Generator().manual_seed(7)
    kv_heads, heads, blocks = 2, 4, 16
    q = torch.randn(SEQ, heads, d, generator=g)
    k, v = torch.randn(2, SEQ, kv_heads, d, generator=g).unbind(0)
    row = d + (INT8_KV_SCALE_BYTES if kv_dtype == torch.int8 else 0)
    k_cache = torch.zeros(kv_heads, blocks * BS, row, dtype=kv_dtype)
    v_cache = torch.zeros_like(k_cache)
    table = torch.randperm(blocks, generator=g)[: -(-SEQ // BS)].to(torch.int64)  # [W]
    slots = table.repeat_interleave(BS) * BS + torch.arange(len(table) * BS) % BS
    ops = kernels.load_cpu_kernels()
    ops.store_kv(k, v, k_cache, v_cache, slots[:SEQ].contiguous(), k_scale, v_scale)
    return q, (k_cache, v_cache), table


# (head_dim, window, softcap, ALiBi): every variant on the fp32 cache, a window on the others
VARIANTS = {"plain": (32, 0, 0.0, False), "window": (64, 40, 0.0, False),
            "softcap-alibi": (32, 0, 20.0, True), "d24": (24, 0, 0.0, False)}  # fmt: skip
CASES = [(torch.float32, v) for v in VARIANTS] + [(f, "window") for f in KV_FORMATS[1:]]


@pytest.mark.parametrize("kv_dtype, variant", CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_attention_rows_of_every_phase_equal_decode_rows(ops, kv_dtype, variant):
    """A query row's attention output is the same bits whichever kernel computes it: as a decode
    row alone (the reference), among a batch of decode rows of other lengths, as one of a short
    chunk's or a verify step's rows (decode rows of the same kernel), as a row of a long first
    chunk (the flash-style kernel over the prompt's own K/V, or over the stored rows for a
    narrow cache) and of a later chunk starting at any position (its paged twin). Every KV cache
    format, read in place with the layer's scales (fp8_e4m3fn's, here 0.5 / 2.0)."""
    d, window, softcap, alibi = VARIANTS[variant]
    scales = (0.5, 2.0) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    q, (k_cache, v_cache), table = _attention_inputs(d, kv_dtype, *scales)
    heads, scale = q.shape[1], d**-0.5
    slopes = -torch.arange(1, heads + 1, dtype=torch.float32) / 8 if alibi else None
    args = (scale, softcap, slopes, *scales)

    def decode(positions: list[int]) -> torch.Tensor:
        pos = torch.tensor(positions, dtype=torch.int64)
        first = (pos + 1 - window).clamp(min=0) if window else torch.zeros_like(pos)
        tables = table.unsqueeze(0).expand(len(positions), -1).contiguous()
        return ops.decode_attention(
            q[positions].contiguous(), k_cache, v_cache, tables, first, pos + 1, BS, *args
        )

    alone = torch.cat([decode([p]) for p in range(SEQ)])  # [SEQ, H, d]

    def check(name: str, start: int, out: torch.Tensor) -> None:
        same = (out == alone[start : start + out.shape[0]]).flatten(1).all(dim=1)
        assert bool(same.all()), f"{name}: rows {(start + (~same).nonzero().flatten()).tolist()}"

    check("decode batch", 0, decode(list(range(SEQ))))
    check("verify / short chunk", 61, decode(list(range(61, 66))))
    if d % 16 != 0:
        return  # the flash kernels' register tiles need head_dim % 16 == 0 (attention.py)
    for start, n in ((0, SEQ), (0, 9), (37, 100), (64, 86), (100, 50)):
        paged = ops.prefill_attention_paged(
            q[start : start + n].contiguous(), k_cache, v_cache, table, start, BS, args[0],
            window, *args[1:],
        )  # fmt: skip
        check(f"paged chunk at {start}", start, paged)
    if kv_dtype == torch.float32:  # a fresh prompt over its own K/V (as stored: exactly)
        slots = table.repeat_interleave(BS) * BS + torch.arange(len(table) * BS) % BS
        k = k_cache[:, slots[:SEQ]].transpose(0, 1)
        v = v_cache[:, slots[:SEQ]].transpose(0, 1)
        for n in (9, 48, 49, SEQ):
            fresh = ops.prefill_attention(q[:n].contiguous(), k[:n], v[:n], scale, window,
                                          softcap, slopes)  # fmt: skip
            check(f"fresh prompt of {n}", 0, fresh)
