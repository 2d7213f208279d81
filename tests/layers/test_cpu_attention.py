"""The CPU paged-attention backend (head-major block cache) against a direct per-query softmax
reference: decode rows of different lengths, fresh prompts, chunked-prefill continuations and
prefix-cache hits (blocks shared with another sequence), with and without a sliding window, fp32 and
bf16 caches, and with logit soft-capping and ALiBi (torch path and compiled kernels, decode and
flash-style prefill)."""

from __future__ import annotations

import pytest
import torch

from pytgi.backends.base import AttentionBatch, AttentionParams, kv_cache_spec
from pytgi.backends.cpu.attention import CpuAttentionBackend
from pytgi.layers.build_context import current_build_context
from pytgi.messages.outputs import NewRequestData, ScheduledRequest, SchedulerOutput
from pytgi.messages.sampling_params import SamplingParams
from pytgi.worker.input_builder import InputBuilder
from pytgi.worker.request_states import RequestStates

BLOCK_SIZE, H, KVH, D = 4, 4, 2, 8
SCALE = D**-0.5
SLOPES = (0.5, 0.25, 0.125, 0.0625)


def reference(
    q, k, v, start: int, window: int | None, softcap=None, alibi=None, chunk=None
) -> torch.Tensor:
    """q [n, H, D] at positions start.., k/v [L, KVH, D] of the whole sequence -> [n, H, D]; the
    scores soft-capped (cap * tanh(s / cap)) and ALiBi-biased (slope * (key - query position))
    when asked; with `chunk` a query sees only the keys of its own chunk."""
    k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)
    scale = q.shape[-1] ** -0.5
    out = []
    for i in range(q.shape[0]):
        p = start + i
        first = 0 if window is None else max(0, p - window + 1)
        if chunk is not None:
            first = p // chunk * chunk
        scores = torch.einsum("hd,lhd->hl", q[i], k[first : p + 1]) * scale  # [H, l]
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi is not None:
            scores = scores + torch.tensor(alibi)[:, None] * (torch.arange(first, p + 1) - p)
        out.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v[first : p + 1]))
    return torch.stack(out)


class Sequences:
    def __init__(self, seed: int, head_dim: int = D, magnitude: float = 1.0):
        self.g = torch.Generator().manual_seed(seed)
        self.head_dim, self.magnitude = head_dim, magnitude
        self.qkv: dict[str, tuple[torch.Tensor, ...]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.next_block = 0

    def add(self, name: str, length: int, shared_from: str | None = None, shared_len: int = 0):
        q, k, v = (
            torch.randn(length, n, self.head_dim, generator=self.g) * self.magnitude
            for n in (H, KVH, KVH)
        )
        blocks = []
        if shared_from is not None:  # prefix-cache hit: same tokens, so the same K/V
            k[:shared_len], v[:shared_len] = (t[:shared_len] for t in self.qkv[shared_from][1:])
            blocks = self.blocks[shared_from][: shared_len // BLOCK_SIZE]
        num_new = -(-length // BLOCK_SIZE) - len(blocks)
        self.blocks[name] = blocks + list(range(self.next_block, self.next_block + num_new))
        self.next_block += num_new
        self.qkv[name] = (q, k, v)


def run_step(
    backend,
    cache,
    seqs: Sequences,
    rows,
    window,
    softcap=None,
    alibi=None,
    kv_dtype=None,
    chunk=None,
    **kv,
):
    """rows: (name, start, end). Runs them as one step and checks each row's output. With a
    narrow `kv_dtype` the model is fp32 and `kv` has the layer's `scales` and the `tol` of the
    comparison; the reference reads `seqs`' K/V as they are (round-trip them to compare exactly
    with what the cache holds)."""
    d = seqs.head_dim
    dtype = cache[0].dtype if kv_dtype is None else torch.float32
    out = SchedulerOutput(
        requests=[
            ScheduledRequest(name, start, end - start, new_block_ids=seqs.blocks[name])
            for name, start, end in rows
        ],
        new_requests=[
            NewRequestData(name, [0] * end, SamplingParams()) for name, start, end in rows
        ],
    )
    states = RequestStates()
    states.update(out)
    inputs, _ = InputBuilder(BLOCK_SIZE).build(out, states)
    attn = inputs.attn
    starts = attn.query_start_loc.tolist()
    q, k, v = (torch.empty(inputs.num_tokens, n, d, dtype=dtype) for n in (H, KVH, KVH))
    order = sorted(range(len(rows)), key=lambda i: rows[i][2] - rows[i][1] > 1)
    for slot, i in enumerate(order):
        name, start, end = rows[i]
        offset = starts[slot]
        for dst, src in zip((q, k, v), seqs.qkv[name], strict=True):
            dst[offset : offset + end - start] = src[start:end]
    params = AttentionParams(
        H,
        KVH,
        d,
        d**-0.5,
        sliding_window=window,
        logits_soft_cap=softcap,
        alibi_slopes=alibi,
        kv_cache_dtype=kv_dtype,
        attention_chunk_size=chunk,
    )
    spec = kv_cache_spec(params, dtype)
    num_blocks = cache[0].shape[1] // BLOCK_SIZE
    metadata = backend.metadata_builder([spec], num_blocks, BLOCK_SIZE).build(attn)
    impl = backend.make_impl(params)
    if "scales" in kv:
        impl.set_kv_scales(kv["scales"])
    out = impl.forward(q, k, v, cache, metadata)
    for slot, i in enumerate(order):
        name, start, end = rows[i]
        offset = starts[slot]
        sq, sk, sv = seqs.qkv[name]
        expected = reference(
            sq[start:end], sk[:end], sv[:end], start, window, softcap, alibi, chunk
        )
        tol = kv.get("tol", 1e-5 if cache[0].dtype == torch.float32 else 3e-2)
        torch.testing.assert_close(
            out[offset : offset + end - start].float(),
            expected,
            rtol=tol,
            atol=tol,
            msg=f"{name} [{start}, {end})",
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 3, 6])
def test_mixed_steps_match_reference(window, dtype, cpu_kernels):
    torch.set_num_threads(1)
    # as the platform does: the kernels serve fp32 models only
    kernels = current_build_context().kernels if dtype == torch.float32 else None
    backend = CpuAttentionBackend(kernels)
    spec = kv_cache_spec(AttentionParams(H, KVH, D, SCALE), dtype)
    cache = backend.allocate_kv_cache(spec, 32, BLOCK_SIZE, torch.device("cpu"))
    seqs = Sequences(seed=0)
    seqs.add("a", 14)
    seqs.add("b", 6)
    seqs.add("c", 13)
    seqs.add("solo", 1)
    if dtype == torch.bfloat16:
        for name, (q, k, v) in seqs.qkv.items():
            seqs.qkv[name] = tuple(t.bfloat16().float() for t in (q, k, v))
    run_step(backend, cache, seqs, [("a", 0, 10), ("b", 0, 3), ("c", 0, 7), ("solo", 0, 1)], window)
    seqs.add("d", 12, shared_from="a", shared_len=8)  # two full blocks of "a"
    seqs.add("e", 9)
    if dtype == torch.bfloat16:
        seqs.qkv["d"] = tuple(t.bfloat16().float() for t in seqs.qkv["d"])
        seqs.qkv["e"] = tuple(t.bfloat16().float() for t in seqs.qkv["e"])
    run_step(
        backend,
        cache,
        seqs,
        [("c", 7, 13), ("b", 3, 4), ("d", 8, 12), ("a", 10, 11), ("e", 0, 9)],
        window,
    )
    run_step(backend, cache, seqs, [("b", 4, 5), ("a", 11, 12)], window)  # decode-only step


@pytest.mark.parametrize(
    "softcap, alibi", [(0.5, None), (None, SLOPES), (2.0, SLOPES)], ids=["softcap", "alibi", "both"]
)
@pytest.mark.parametrize("window", [None, 6])
def test_softcap_and_alibi_match_reference(softcap, alibi, window, cpu_kernels):
    """head_dim 16 and two 64-key blocks' worth of prompt, so the compiled flash prefill kernels
    (fresh and paged) run too; large scores so that the cap bites."""
    torch.set_num_threads(1)
    backend = CpuAttentionBackend(current_build_context().kernels)
    spec = kv_cache_spec(AttentionParams(H, KVH, 16, 0.25), torch.float32)
    cache = backend.allocate_kv_cache(spec, 64, BLOCK_SIZE, torch.device("cpu"))
    seqs = Sequences(seed=1, head_dim=16, magnitude=2.0)
    seqs.add("long", 90)
    seqs.add("short", 7)
    seqs.add("solo", 1)
    mods = dict(softcap=softcap, alibi=alibi)
    run_step(
        backend, cache, seqs, [("long", 0, 70), ("short", 0, 5), ("solo", 0, 1)], window, **mods
    )
    seqs.add("hit", 40, shared_from="long", shared_len=32)
    run_step(
        backend,
        cache,
        seqs,
        [("short", 5, 6), ("long", 70, 90), ("hit", 32, 40)],
        window,
        **mods,
    )
    run_step(backend, cache, seqs, [("short", 6, 7), ("long", 89, 90)], window, **mods)


@pytest.mark.parametrize("head_dim", [8, 16])
def test_chunked_attention_matches_reference(head_dim, cpu_kernels):
    """Llama 4's chunked attention (chunk 5, not a multiple of the 4-token blocks): fresh prompts
    crossing several chunks, continuations starting mid-chunk and on a boundary, a prefix hit and
    decode rows on both sides of a boundary. head_dim 16 runs the compiled flash prefill too."""
    torch.set_num_threads(1)
    backend = CpuAttentionBackend(current_build_context().kernels)
    spec = kv_cache_spec(AttentionParams(H, KVH, head_dim, head_dim**-0.5), torch.float32)
    cache = backend.allocate_kv_cache(spec, 32, BLOCK_SIZE, torch.device("cpu"))
    seqs = Sequences(seed=2, head_dim=head_dim)
    seqs.add("a", 23)
    seqs.add("b", 11)
    seqs.add("solo", 1)
    run_step(backend, cache, seqs, [("a", 0, 13), ("b", 0, 4), ("solo", 0, 1)], None, chunk=5)
    seqs.add("hit", 17, shared_from="a", shared_len=8)
    rows = [("b", 4, 5), ("a", 13, 22), ("hit", 8, 17)]
    run_step(backend, cache, seqs, rows, None, chunk=5)
    run_step(backend, cache, seqs, [("b", 5, 6), ("a", 22, 23)], None, chunk=5)  # decode only
    run_step(backend, cache, seqs, [("b", 6, 11)], None, chunk=5)  # a whole chunk from its start


def test_chunked_attention_refuses_a_window_too():
    from pytgi.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="sliding window and attention chunks"):
        CpuAttentionBackend(None).make_impl(
            AttentionParams(H, KVH, D, SCALE, sliding_window=4, attention_chunk_size=8)
        )


def decode_batch(start_positions: list[int], tables: list[list[int]]) -> AttentionBatch:
    width = max(map(len, tables))
    return AttentionBatch(
        query_start_loc=torch.arange(len(tables) + 1),
        seq_lens=torch.tensor(start_positions) + 1,
        block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        slot_mapping=torch.zeros(len(tables), dtype=torch.int64),
        block_size=4,
        num_decode_rows=len(tables),
    )


def torch_metadata(batch: AttentionBatch, windows: list[int | None]):
    params = [AttentionParams(H, KVH, D, SCALE, sliding_window=w) for w in windows]
    specs = [kv_cache_spec(p, torch.float32) for p in params]
    return CpuAttentionBackend(None).metadata_builder(specs, 8, 4).build(batch)


def test_decode_window_gathers_only_the_window():
    batch = decode_batch([9, 2], [[0, 1, 2], [3]])
    view = torch_metadata(batch, [4]).views[4]
    # row 0 at position 9 sees 6..9 (keys 2..5 of blocks 1, 2); row 1 at position 2 sees 0..2 of
    # block 3 (padded with block 0)
    decode = view.decode
    assert decode.blocks.tolist() == [[1, 2], [3, 0]]
    assert (decode.offset, decode.length) == (0, 6)
    assert decode.mask[:, 0, 0].tolist() == [[False, False] + [True] * 4, [True] * 3 + [False] * 3]
    assert view.prefills == []


def test_decode_rows_of_equal_length_need_no_mask():
    batch = decode_batch([9, 9], [[0, 1, 2], [5, 3, 4]])
    metadata = torch_metadata(batch, [None, 4])
    decode = metadata.views[None].decode
    assert decode.blocks.tolist() == [[0, 1, 2], [5, 3, 4]]
    assert (decode.offset, decode.length, decode.mask) == (0, 10, None)
    # window 4: both rows see positions 6..9, keys 2..5 of blocks 1, 2 (3, 4)
    decode = metadata.views[4].decode
    assert decode.blocks.tolist() == [[1, 2], [3, 4]]
    assert (decode.offset, decode.length, decode.mask) == (2, 4, None)


@pytest.mark.parametrize(
    "extra, named",
    [
        ({"logits_soft_cap": 0.0}, "logits_soft_cap must be positive"),
        ({"alibi_slopes": (0.5,) * (H - 1)}, "one slope per query head"),
        ({"head_size_v": 4}, "head_size_v"),
    ],
)
def test_parameters_the_backend_cannot_honour_are_refused_when_built(extra, named):
    from pytgi.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=named):
        CpuAttentionBackend(None).make_impl(AttentionParams(H, KVH, D, SCALE, **extra))


def test_kv_cache_specs_size_the_cache():
    full = kv_cache_spec(AttentionParams(H, KVH, D, SCALE), torch.float32)
    sliding = kv_cache_spec(AttentionParams(H, KVH, D, SCALE, sliding_window=8), torch.bfloat16)
    assert type(full).__name__ == "FullAttentionSpec" and full.bytes_per_token == KVH * 2 * D * 4
    assert type(sliding).__name__ == "SlidingWindowSpec" and sliding.sliding_window == 8
    assert sliding.bytes_per_token == KVH * 2 * D * 2


def test_kv_groups_read_each_layers_own_table(cpu_kernels):
    """A full layer and a window-6 layer of one model in two KV groups: each group's caches have
    their own block count (32 and 16) and each request its own table per group (the window
    group's ids differ), and each layer stores at and reads through its group's table only
    (fresh prompts, continuations with prefix-shared blocks, decode rows)."""
    torch.set_num_threads(1)
    kernels = current_build_context().kernels
    backend = CpuAttentionBackend(kernels)
    full, window = (AttentionParams(H, KVH, D, SCALE, sliding_window=w) for w in (None, 6))
    specs = [kv_cache_spec(p, torch.float32) for p in (full, window)]
    caches = [
        backend.allocate_kv_cache(spec, n, BLOCK_SIZE, torch.device("cpu"))
        for spec, n in zip(specs, (32, 16), strict=True)
    ]
    builder = backend.metadata_builder(specs, (32, 16), BLOCK_SIZE)
    impls = [backend.make_impl(p) for p in (full, window)]
    seqs = Sequences(seed=3)
    seqs.add("a", 14)
    seqs.add("b", 6)
    seqs.add("c", 13)
    seqs.add("d", 12, shared_from="a", shared_len=8)
    window_ids = {name: [15 - b for b in blocks] for name, blocks in seqs.blocks.items()}
    states, sent = RequestStates(), set()
    builder_in = InputBuilder(BLOCK_SIZE)
    builder_in.num_kv_groups = 2
    steps = [
        [("a", 0, 10), ("b", 0, 3), ("c", 0, 7)],
        [("c", 7, 13), ("b", 3, 4), ("d", 8, 11), ("a", 10, 11)],
        [("b", 4, 5), ("a", 11, 12), ("d", 11, 12)],
    ]
    for rows in steps:
        out = SchedulerOutput(
            requests=[
                ScheduledRequest(
                    name,
                    start,
                    end - start,
                    new_block_ids=[] if name in sent else seqs.blocks[name],
                    new_group_block_ids=[[] if name in sent else window_ids[name]],
                )  # fmt: skip
                for name, start, end in rows
            ],
            new_requests=[
                NewRequestData(name, [0] * 14, SamplingParams())
                for name, _, _ in rows
                if name not in sent
            ],
        )
        sent |= {name for name, _, _ in rows}
        states.update(out)
        inputs, _ = builder_in.build(out, states)
        starts = inputs.attn.query_start_loc.tolist()
        order = sorted(range(len(rows)), key=lambda i: rows[i][2] - rows[i][1] > 1)
        metadata = builder.build(inputs.attn)
        q, k, v = (torch.empty(inputs.num_tokens, n, D) for n in (H, KVH, KVH))
        for slot, i in enumerate(order):
            name, start, end = rows[i]
            for dst, src in zip((q, k, v), seqs.qkv[name], strict=True):
                dst[starts[slot] : starts[slot] + end - start] = src[start:end]
        for impl, cache, w in zip(impls, caches, (None, 6), strict=True):
            got = impl.forward(q, k, v, cache, metadata)
            for slot, i in enumerate(order):
                name, start, end = rows[i]
                sq, sk, sv = seqs.qkv[name]
                expected = reference(sq[start:end], sk[:end], sv[:end], start, w)
                torch.testing.assert_close(
                    got[starts[slot] : starts[slot] + end - start], expected, rtol=1e-5, atol=1e-5
                )
    # the window layer's K/V went to its own blocks: "a"'s first token at window block 15
    assert torch.equal(caches[1][0][:, 15 * BLOCK_SIZE], seqs.qkv["a"][1][0])
    assert torch.equal(caches[0][0][:, 0], seqs.qkv["a"][1][0])
