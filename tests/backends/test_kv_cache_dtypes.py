"""`--kv-cache-dtype` on the CPU backend: narrow caches (fp8_e4m3fn, fp8_e5m2, bfloat16, float16,
int8 with per-token, per-head scales below an fp32 model) against the fp32-cache reference within
each format's error, exactly equal to attention over the K/V the cache holds (every read path
sees the stored values), the
checkpoint's per-layer fp8 scales, and the memory plan that counts the narrower blocks."""

from __future__ import annotations

import pytest
import torch
from layers.test_cpu_attention import BLOCK_SIZE, KVH, SCALE, H, Sequences, run_step

from pytgi.backends.base import AttentionParams, KVScales, kv_cache_spec
from pytgi.backends.cpu.attention import CpuAttentionBackend, _as_stored
from pytgi.layers.build_context import current_build_context

# |out - fp32 reference| bound of unit-scale attention per format: about 2x the largest error
# over five seeds (bf16 8e-3, fp16 1e-3, e4m3 0.14, e5m2 0.27, int8 1.1e-2; outputs are O(1))
TOLERANCE = {
    torch.bfloat16: 2e-2,
    torch.float16: 3e-3,
    torch.float8_e4m3fn: 0.25,
    torch.float8_e5m2: 0.5,
    torch.int8: 3e-2,
}
NARROW = list(TOLERANCE)


def mixed_steps(backend, kv_dtype, seqs: Sequences, window, **kv):
    """Fresh prompts, chunked continuations, a prefix-cache hit and decode rows, in three steps."""
    spec = kv_cache_spec(AttentionParams(H, KVH, D, SCALE, kv_cache_dtype=kv_dtype), torch.float32)
    cache = backend.allocate_kv_cache(spec, 32, BLOCK_SIZE, torch.device("cpu"))
    assert cache[0].dtype == kv_dtype
    run = dict(kv_dtype=kv_dtype, **kv)
    for name, length in (("a", 14), ("b", 6), ("c", 13), ("solo", 1)):
        seqs.add(name, length)
    rows = [("a", 0, 10), ("b", 0, 3), ("c", 0, 7), ("solo", 0, 1)]
    run_step(backend, cache, seqs, rows, window, **run)
    seqs.add("d", 12, shared_from="a", shared_len=8)
    seqs.add("e", 9)
    rows = [("c", 7, 13), ("b", 3, 4), ("d", 8, 12), ("a", 10, 11), ("e", 0, 9)]
    run_step(backend, cache, seqs, rows, window, **run)
    run_step(backend, cache, seqs, [("b", 4, 5), ("a", 11, 12)], window, **run)
    return cache


D = 8


class RoundTripped(Sequences):
    """Sequences whose K/V are already what a cache of `dtype` (with `scales`) returns."""

    def __init__(self, seed: int, dtype: torch.dtype, scales: KVScales):
        super().__init__(seed)
        self.dtype, self.scales = dtype, scales

    def add(self, name, length, shared_from=None, shared_len=0):
        super().add(name, length, shared_from, shared_len)
        q, k, v = self.qkv[name]
        k = _as_stored(k, self.dtype, self.scales.k_scale)
        v = _as_stored(v, self.dtype, self.scales.v_scale)
        self.qkv[name] = (q, k, v)


@pytest.mark.parametrize("kv_dtype", NARROW, ids=str)
@pytest.mark.parametrize("window", [None, 6])
def test_narrow_caches_stay_within_their_error_of_the_fp32_cache(kv_dtype, window, cpu_kernels):
    """The backend of an fp32 model (the pure-torch path, then the compiled kernels reading the
    narrow cache in place) against attention over the exact fp32 K/V."""
    torch.set_num_threads(1)
    backend = CpuAttentionBackend(current_build_context().kernels)
    mixed_steps(backend, kv_dtype, Sequences(seed=0), window, tol=TOLERANCE[kv_dtype])


@pytest.mark.parametrize("kv_dtype", NARROW, ids=str)
def test_every_read_sees_exactly_what_the_cache_holds(kv_dtype, cpu_kernels):
    """Against attention over the round-tripped K/V at fp32 tolerance: fresh prompts (their own
    K/V), later chunks and prefix hits (gathered blocks) and decode rows all read the stored
    values, so a row's output does not depend on which step stored its keys."""
    torch.set_num_threads(1)
    backend = CpuAttentionBackend(current_build_context().kernels)
    seqs = RoundTripped(1, kv_dtype, KVScales())
    mixed_steps(backend, kv_dtype, seqs, window=None, tol=1e-5)


def test_fp8_e4m3fn_stores_k_over_k_scale_and_reads_it_back(cpu_kernels):
    """The checkpoint's scales: a key is stored as k / k_scale (values past e4m3's 448 fit once
    scaled) and read back times k_scale."""
    torch.set_num_threads(1)
    backend = CpuAttentionBackend(current_build_context().kernels)
    scales = KVScales(k_scale=0.05, v_scale=4.0)  # values stored 20x larger, 4x smaller
    seqs = RoundTripped(2, torch.float8_e4m3fn, scales)
    cache = mixed_steps(backend, torch.float8_e4m3fn, seqs, None, tol=1e-5, scales=scales)
    k_a = seqs.qkv["a"][1]  # [14, KVH, D], positions 0..11 stored
    slots = torch.tensor(seqs.blocks["a"]).repeat_interleave(BLOCK_SIZE) * BLOCK_SIZE
    slots = (slots + torch.arange(len(slots)) % BLOCK_SIZE)[:12]
    stored = cache[0][:, slots].float().transpose(0, 1)  # [12, KVH, D]
    torch.testing.assert_close(stored * 0.05, k_a[:12], rtol=0, atol=0)


@pytest.mark.parametrize("kv_dtype", NARROW, ids=str)
def test_the_kernels_store_the_torch_paths_bytes(kv_dtype):
    """The compiled store_kv writes every format exactly as the torch path encodes it (rounding,
    saturation, the layer's scale; int8: each row's values and its own scale), so either path
    reads the other's cache."""
    from pytgi.backends.cpu.attention import _encode
    from pytgi.backends.cpu.kernels import load_cpu_kernels

    ops = load_cpu_kernels()
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(2, 9, KVH, 24, generator=g).unbind(0)
    k[0, 0, :3] = torch.tensor([1e5, -1e5, 0.0])  # past every narrow range
    v[1, 1] = 0.0  # an all-zero row (int8: scale 0)
    k_scale, v_scale = (0.5, 3.0) if kv_dtype == torch.float8_e4m3fn else (1.0, 1.0)
    spec = kv_cache_spec(AttentionParams(H, KVH, 24, SCALE, kv_cache_dtype=kv_dtype), torch.float32)
    k_cache, v_cache = CpuAttentionBackend(None).allocate_kv_cache(spec, 4, 4, torch.device("cpu"))
    slots = torch.tensor([3, 0, 7, 12, 15, 4, 9, 1, 2])
    ops.store_kv(k, v, k_cache, v_cache, slots, k_scale, v_scale)
    for cache, x, scale in ((k_cache, k, k_scale), (v_cache, v, v_scale)):
        expected = _encode(x.transpose(0, 1), kv_dtype, scale)  # [KVH, 9, row]
        assert torch.equal(cache[:, slots].view(torch.uint8), expected.view(torch.uint8))


def test_int8_rows_carry_their_own_scale():
    """An int8 row: round(x / s) with s = max |x| / 127 of that token and head, then s."""
    x = torch.tensor([[0.5, -1.27, 0.01, 0.0], [0.0, 0.0, 0.0, 0.0]])
    stored = _as_stored(x, torch.int8, 1.0)
    assert stored[0].tolist() == pytest.approx([0.5, -1.27, 0.01, 0.0], abs=0.0051)
    assert stored[0, 1].item() == pytest.approx(-1.27, abs=1e-6)  # the extreme is exact
    assert stored[1].tolist() == [0.0] * 4


def test_saturation_without_scales_and_scales_only_for_e4m3():
    big = torch.tensor([[1000.0, -1000.0, 3.0]])
    assert _as_stored(big, torch.float8_e4m3fn, 1.0).tolist() == [[448.0, -448.0, 3.0]]
    assert _as_stored(big, torch.float8_e4m3fn, 4.0).tolist() == [[1024.0, -1024.0, 3.0]]
    assert _as_stored(big * 100, torch.float16, 1.0).tolist() == [[65504.0, -65504.0, 300.0]]
    params = AttentionParams(H, KVH, D, SCALE, kv_cache_dtype=torch.float8_e5m2)
    impl = CpuAttentionBackend(None).make_impl(params)
    impl.set_kv_scales(KVScales(2.0, 2.0))  # TGI applies scales to fp8_e4m3fn caches only
    assert impl.scales.is_unit and impl.kv_scales == KVScales(2.0, 2.0)


@pytest.mark.parametrize(
    "kv_dtype, ratio",
    [(None, 1), ("bfloat16", 2), ("float16", 2), ("fp8_e4m3fn", 4), ("fp8_e5m2", 4),
     ("int8", 64 / 20)],  # int8: 16 values and a 4-byte scale per row instead of 64 bytes
)  # fmt: skip
def test_the_memory_plan_counts_the_narrower_blocks(kv_dtype, ratio, tiny_llama_dir):
    """The same KV budget holds `ratio` times the fp32 cache's blocks (int8: its scales
    counted)."""
    from models.runner_utils import engine_config

    from pytgi.backends.selector import select_platform
    from pytgi.worker.model_runner import ModelRunner

    budget = 1 << 20
    config = engine_config(tiny_llama_dir, max_kv_cache_bytes=budget, kv_cache_dtype=kv_dtype)
    runner = ModelRunner(config, select_platform())
    runner.load_model(tiny_llama_dir)
    fp32_block = 2 * 2 * KVH * 16 * 4 * runner.block_size  # layers x (K, V) x heads x dim x 4 B
    assert runner.bytes_per_block * ratio == pytest.approx(fp32_block)
    assert runner.profile_num_blocks() == budget // runner.bytes_per_block
    assert runner.accelerator is not None  # the fused decode stack reads every format
