"""The fused CPU decode stack (the runner's decode-step accelerator, backends/cpu/fused_decode.py)
against the same model run layer by layer, for every architecture: decode steps of 9 rows (more
than one 6-row register block) at different lengths, past the sliding windows, with every block
kind (sequential, parallel with one or two norms, sandwich), RMS and Layer norms, gated and plain
MLPs, partial, interleaved and per-layer rotary, learned positions, ALiBi, soft-capping, biases,
q/k norms and Granite's multipliers in play, with fp32 weights and with quantized ones (int8 and
4-bit codes, multiplied with int8 activations as the layers do); and its allow-list, which
refuses any spec feature it was not told about. Parity with transformers itself is
test_parity.py's job (its decode steps run fused too)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fixtures.tiny_models import ARCHS, FALLBACK_ARCHS
from models.runner_utils import BlockAllocator, make_runner, prompt, scheduled, step

from pytgi.backends.cpu.fused_decode import unsupported_features
from pytgi.backends.cpu.kernels import load_cpu_kernels
from pytgi.worker.model_runner import ModelRunner

LENGTHS = (1, 3, 9, 16, 17, 25, 31, 40, 47)  # mistral's window is 24
NATIVE_ARCHS = [a for a in ARCHS if a not in FALLBACK_ARCHS]  # the fallback has no fused stack


@pytest.fixture(scope="module", params=NATIVE_ARCHS)
def runner(request, tiny_model_factory):
    assert load_cpu_kernels() is not None, "the CPU kernels failed to build"
    return make_runner(tiny_model_factory(request.param))


@pytest.fixture(scope="module", params=NATIVE_ARCHS)
def quantized_runner(request, tiny_model_factory):
    """Every architecture with int8 per-channel codes (eetq) and int8 activations, the opt-in the
    fused stack serves (TGI's default for eetq and NF4, fp32 activations, runs layer by layer;
    the stack's 4-bit paths are held by the GGUF tests)."""
    return make_runner(
        tiny_model_factory(request.param), quantize="eetq", quantize_activations="int8"
    )


def prefilled(runner) -> dict[str, tuple[list[int], list[int], int]]:
    """Prompts of LENGTHS prefilled in one step plus one greedy token each:
    request id -> (token ids, block ids, prompt length)."""
    blocks = BlockAllocator()
    seqs = {f"r{n}": (prompt(n, seed=n), blocks.take(n + 8), n) for n in LENGTHS}
    logits = runner.forward(
        step(*(scheduled(rid, ids, 0, n, table) for rid, (ids, table, n) in seqs.items()))
    )
    return {
        rid: (ids + [int(row.argmax())], table, n)
        for (rid, (ids, table, n)), row in zip(seqs.items(), logits, strict=True)
    }


def decode_step(seqs):
    return step(
        *(
            scheduled(rid, ids, len(ids) - 1, len(ids), table, num_prompt=n)
            for rid, (ids, table, n) in seqs.items()
        )
    )


def fused_stack(runner):
    return runner.accelerator.stack


def counting_runs(runner, monkeypatch) -> list:
    """Record every step the accelerator takes."""
    runs, for_step = [], runner.accelerator.for_step

    def counted(*args):
        fused = for_step(*args)
        runs.append(fused is not None)
        return fused

    monkeypatch.setattr(runner.accelerator, "for_step", counted)
    return runs


def test_fused_decode_matches_layer_by_layer(runner, monkeypatch):
    check_fused_matches_layer_by_layer(runner, monkeypatch)


def test_fused_decode_with_quantized_linears_matches_layer_by_layer(quantized_runner, monkeypatch):
    layers = quantized_runner.model.fused_decode_layers()
    assert layers is not None and all(
        any(key.endswith(".codes") for key in tensors) for _, tensors in layers
    )  # every layer hands over quantized weights
    check_fused_matches_layer_by_layer(quantized_runner, monkeypatch)
    seqs = prefilled(quantized_runner)
    outputs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outputs.append(quantized_runner.forward(decode_step(seqs)))
    torch.set_num_threads(1)
    assert torch.equal(outputs[0], outputs[1])


def check_fused_matches_layer_by_layer(runner, monkeypatch):
    torch.set_num_threads(2)
    seqs = prefilled(runner)
    accelerator = runner.accelerator
    assert accelerator is not None, "the fused decode stack refused a Llama-family model"
    runs = counting_runs(runner, monkeypatch)
    for _ in range(3):  # the same step twice writes the same K/V to the same slots
        runner.accelerator = None
        reference = runner.forward(decode_step(seqs))  # [9, V]
        runner.accelerator = accelerator
        fused = runner.forward(decode_step(seqs))
        assert runs[-1], "the decode step did not run fused"
        assert (fused - reference).abs().max().item() <= 1e-5
        assert torch.equal(fused.argmax(-1), reference.argmax(-1))
        seqs = {
            rid: (ids + [int(row.argmax())], table, n)
            for (rid, (ids, table, n)), row in zip(seqs.items(), fused, strict=True)
        }


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "fp8_e4m3fn", "int8"])
def test_fused_decode_reads_narrow_caches_as_the_layers_do(
    kv_cache_dtype, tiny_model_factory, monkeypatch
):
    """The stack stores and reads a narrow cache in place as the layers' kernels do (fp8_e4m3fn
    with per-layer scales, int8 with its per-row scales)."""
    from models.runner_utils import engine_config

    from pytgi.backends.base import KVScales
    from pytgi.backends.cpu.fused_decode import FusedDecodeStack
    from pytgi.backends.selector import select_platform
    from pytgi.layers.attention import Attention

    model_dir = tiny_model_factory("llama")
    narrow = ModelRunner(engine_config(model_dir, kv_cache_dtype=kv_cache_dtype), select_platform())
    narrow.load_model(model_dir)
    if kv_cache_dtype == "fp8_e4m3fn":  # the checkpoint's scales, 0.5 / 2.0 in every layer
        for m in narrow.model.modules():
            if isinstance(m, Attention):
                m.impl.set_kv_scales(KVScales(0.5, 2.0))
        narrow.accelerator = FusedDecodeStack.for_model(narrow.model, load_cpu_kernels())
        assert narrow.accelerator.k_scales == [0.5] * narrow.model.spec.num_layers
    narrow.allocate_kv_cache(128)
    check_fused_matches_layer_by_layer(narrow, monkeypatch)


def test_fused_decode_is_the_same_on_any_number_of_threads(runner):
    seqs = prefilled(runner)
    outputs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        outputs.append(runner.forward(decode_step(seqs)))
    torch.set_num_threads(1)
    assert torch.equal(outputs[0], outputs[1])


def test_prefill_steps_stay_layer_by_layer(tiny_model_factory):
    runner = make_runner(tiny_model_factory("llama"))
    runs = counting_runs(runner, pytest.MonkeyPatch())
    blocks = BlockAllocator()
    a, b = prompt(12, seed=1), prompt(5, seed=2)
    a_blocks, b_blocks = blocks.take(13), blocks.take(5)
    logits = runner.forward(step(scheduled("a", a, 0, 12, a_blocks)))
    a = a + [int(logits[0].argmax())]
    runner.forward(
        step(scheduled("a", a, 12, 13, a_blocks, num_prompt=12), scheduled("b", b, 0, 5, b_blocks))
    )
    assert runs == [False, False]  # a prompt, then a decode row mixed with a fresh prompt


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_verify_steps_run_fused_as_decode_rows(arch, tiny_model_factory, monkeypatch):
    """A speculative verify step (each request's last token and 3 more, k + 1 = 4 queries after
    cached keys) runs in the stack: it equals the layer-by-layer path within fp32 tolerance, and
    each request's last row is bit for bit what 4 decode steps give (row invariance), also past
    the sliding windows with per-layer KV groups (gemma3)."""
    runner = make_runner(tiny_model_factory(arch))
    seqs = prefilled(runner)
    more = {rid: prompt(3, seed=70 + i) for i, rid in enumerate(seqs)}

    def continuation(done: int, num: int):  # tokens [len(ids) - 1 + done, ... + num) of each
        return step(
            *(
                scheduled(
                    rid,
                    ids + more[rid],
                    len(ids) - 1 + done,
                    len(ids) - 1 + done + num,
                    table,
                    num_prompt=n,
                )  # fmt: skip
                for rid, (ids, table, n) in seqs.items()
            )
        )

    torch.set_num_threads(2)
    try:
        runs, accelerator = counting_runs(runner, monkeypatch), runner.accelerator
        runner.accelerator = None
        reference = runner.forward(continuation(0, 4))  # [9, V]: each request's last row
        runner.accelerator = accelerator
        verify = runner.forward(continuation(0, 4))
        assert runs == [True], "the verify step did not run fused"
        assert (verify - reference).abs().max().item() <= 1e-5
        for done in range(4):
            decoded = runner.forward(continuation(done, 1))
        assert runs == [True] * 5
        assert torch.equal(decoded, verify)
    finally:
        torch.set_num_threads(1)


def test_fused_stack_rejects_bad_metadata(runner):
    fused = fused_stack(runner)
    layers = runner.model.model.layers
    caches = [runner.kv_caches[layer.self_attn.attn.layer_name] for layer in layers]
    hidden_size = runner.spec.hidden_size
    tables, rotary_dim = max(1, len(runner.model.model.rotary_embs)), runner.model.model.rotary_dim
    args = dict(
        hidden=torch.zeros(1, hidden_size),
        cos=torch.ones(tables, 1, rotary_dim),
        sin=torch.zeros(tables, 1, rotary_dim),
        slots=[torch.tensor([0])],
        block_tables=[torch.tensor([[0]])],
        seq_lens=torch.tensor([1]),
        block_size=16,
        k_caches=[k for k, _ in caches],
        v_caches=[v for _, v in caches],
    )
    num_slots = caches[0][0].shape[1]
    for bad, message in (
        ({"slots": [torch.tensor([num_slots])]}, "bad slot"),
        ({"block_tables": [torch.tensor([[num_slots]])]}, "block id out of range"),
        # one table per layer (KV groups): the last layer's block is out of range
        (
            {
                "slots": [torch.tensor([0])] * len(layers),
                "block_tables": [torch.tensor([[0]])] * (len(layers) - 1)
                + [torch.tensor([[num_slots]])],
            },
            "block id out of range",
        ),
        ({"slots": [torch.tensor([0])] * 2 * len(layers)}, "one slot tensor and block table"),
        ({"seq_lens": torch.tensor([17])}, "bad sequence length"),
        ({"k_caches": args["k_caches"][:-1]}, "one K and one V cache per layer"),
        ({"hidden": torch.zeros(1, hidden_size + 1)}, "hidden must be"),
        ({"cos": torch.ones(tables, 2, rotary_dim)}, "cos / sin must be"),
    ):
        with pytest.raises(RuntimeError, match=message):
            fused.forward(**(args | bad))
    hidden, residual = fused.forward(**args)  # the valid call runs
    assert hidden.shape == residual.shape == (1, hidden_size)


def test_the_allow_list_refuses_what_the_kernel_does_not_compute(runner):
    spec = runner.spec
    assert unsupported_features(spec) == []
    assert unsupported_features(dataclasses.replace(spec, hidden_act="relu")) == [
        "hidden_act='relu'"
    ]


def test_a_spec_field_without_a_role_or_a_new_feature_is_refused(runner):
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class WithFlags(type(runner.spec)):
        post_norms: bool = dataclasses.field(default=False, metadata={"role": "feature"})
        mystery: int = 0  # no role declared

    spec = WithFlags(**dataclasses.asdict(runner.spec))
    assert unsupported_features(spec) == ["mystery (no accelerator role declared)"]
    spec = dataclasses.replace(spec, post_norms=True)
    assert "post_norms=True" in unsupported_features(spec)
