"""Multi-LoRA: adapters made with PEFT, served in one batch with the base model, against
transformers with PEFT's merged model for each adapter (identical greedy tokens, close logprobs)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from fixtures.lora_adapters import ADAPTERS, make_adapter, merged_model
from models.runner_utils import (
    BlockAllocator,
    hf_greedy_logprobs,
    load_hf,
    make_runner,
    prompt,
    scheduled,
    step,
)

from pytgi.backends.cpu.fused_decode import FusedDecodeStack
from pytgi.backends.cpu.kernels import load_cpu_kernels
from pytgi.config import LoRAAdapter, parse_lora_adapters
from pytgi.errors import ConfigError, ModelLoadError
from pytgi.runtime.llm import LLM

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def lora_dirs(tiny_model_factory, tmp_path_factory):
    base = tiny_model_factory("llama")
    root = tmp_path_factory.mktemp("lora")
    adapters = {
        name: make_adapter(base, root / name, seed=i, **options)
        for i, (name, options) in enumerate(ADAPTERS.items())
    }
    return base, adapters


def test_mixed_batch_matches_peft_merged_models(lora_dirs):
    """Base rows and three adapters (different ranks, targets, rsLoRA, rank/alpha patterns) in
    one batch, with chunked prefill (16-token steps) and prefix-cache hits within an adapter."""
    torch.set_num_threads(1)
    check_mixed_adapter_batch(lora_dirs)


def check_mixed_adapter_batch(lora_dirs, **engine_options) -> None:
    """The mixed batch above on an engine with `engine_options` (the GPU test: dtype float32)."""
    base, adapters = lora_dirs
    refs = {None: load_hf(base), **{k: merged_model(base, d) for k, d in adapters.items()}}
    shared = prompt(24, 1)
    requests = [
        (None, prompt(7, 2)),
        ("all-r4", prompt(29, 3)),
        ("qv-rslora", shared + prompt(3, 4)),
        ("patterns", prompt(11, 5)),
        ("all-r4", shared + prompt(5, 6)),
        (None, shared + prompt(2, 7)),
    ]
    expected = [hf_greedy_logprobs(refs[a], ids, NEW_TOKENS) for a, ids in requests]
    spec = ",".join(f"{k}={d}" for k, d in adapters.items())
    llm = LLM(str(base), lora_adapters=spec, block_size=4, num_blocks=200,
              max_batch_prefill_tokens=16, **engine_options)  # fmt: skip
    try:
        ids = [ids for _, ids in requests]
        outs = llm.generate(
            ids, max_new_tokens=NEW_TOKENS, ignore_eos=True, adapter_ids=[a for a, _ in requests]
        )
        for out, (tokens, logprobs) in zip(outs, expected, strict=True):
            assert out.token_ids == tokens
            assert out.logprobs == pytest.approx(logprobs, abs=2e-3)
        # the adapters change the outputs (a no-op adapter would pass the checks above)
        assert len({tuple(hf_greedy_logprobs(refs[a], ids[1], NEW_TOKENS)[0]) for a in refs}) > 1
        # prefix hits: the shared prefix is cached per adapter, never across adapters
        again = [("all-r4", shared + prompt(4, 8)), ("patterns", shared + prompt(4, 9))]
        outs = llm.generate(
            [i for _, i in again], max_new_tokens=NEW_TOKENS, ignore_eos=True,
            adapter_ids=[a for a, _ in again],
        )  # fmt: skip
        assert [o.num_cached_tokens for o in outs] == [24, 0]
        for out, (a, i) in zip(outs, again, strict=True):
            assert out.token_ids == hf_greedy_logprobs(refs[a], i, NEW_TOKENS)[0]
    finally:
        llm.close()


def test_quantized_base_with_adapter(lora_dirs):
    """Quantized base weights (eetq: int8) with the adapter's delta in full precision: equal to
    the same quantized base plus PEFT's delta, checked as delta(adapter) on both paths."""
    torch.set_num_threads(1)
    base, adapters = lora_dirs
    llm = LLM(str(base), quantize="eetq", lora_adapters=f"a={adapters['all-r4']}", num_blocks=64)
    try:
        ids = prompt(9, 11)
        plain, adapted = llm.generate([ids, ids], max_new_tokens=NEW_TOKENS, ignore_eos=True,
                                      adapter_ids=[None, "a"])  # fmt: skip
        expected = hf_greedy_logprobs(merged_model(base, adapters["all-r4"]), ids, NEW_TOKENS)[0]
        assert adapted.token_ids[:4] == expected[:4]
        assert adapted.token_ids != plain.token_ids
    finally:
        llm.close()


# (adapter, prompt length) per row of the decode steps below: base rows and every adapter, one
# adapter twice, 8 rows (past the stack's 6-row register block)
DECODE_ROWS = [(None, 5), ("all-r4", 9), ("qv-rslora", 3), ("patterns", 17), ("all-r4", 12),
               (None, 20), ("patterns", 2), ("qv-rslora", 7)]  # fmt: skip


def lora_runner(lora_dirs, **options):
    base, adapters = lora_dirs
    spec = ",".join(f"{k}={d}" for k, d in adapters.items())
    runner = make_runner(base, lora_adapters=spec, **options)
    assert runner.accelerator is not None, "the fused decode stack is off"
    assert runner.accelerator.num_adapters == len(adapters)
    return runner


def prefilled(runner, rows=DECODE_ROWS):
    """Each row's prompt prefilled (one step, layer by layer) plus its greedy token:
    request id -> (token ids, block ids, prompt length, adapter)."""
    blocks = BlockAllocator()
    seqs = {
        f"r{i}": (prompt(n, seed=40 + i), blocks.take(n + 8), n, a) for i, (a, n) in enumerate(rows)
    }
    logits = runner.forward(
        step(
            *(
                scheduled(r, ids, 0, n, table, adapter_id=a)
                for r, (ids, table, n, a) in seqs.items()
            )
        )
    )
    return {
        rid: (ids + [int(row.argmax())], table, n, a)
        for (rid, (ids, table, n, a)), row in zip(seqs.items(), logits, strict=True)
    }


def decode_step(seqs, only=None):
    return step(
        *(
            scheduled(rid, ids, len(ids) - 1, len(ids), table, num_prompt=n, adapter_id=a)
            for rid, (ids, table, n, a) in seqs.items()
            if only is None or rid in only
        )
    )


def counting_runs(accelerator, monkeypatch) -> list[tuple[bool, bool]]:
    """(the stack ran, the step had adapter rows) per step the accelerator is asked about."""
    runs, for_step = [], accelerator.for_step

    def counted(batch, metadata, kv_caches, adapter_slots=None):
        fused = for_step(batch, metadata, kv_caches, adapter_slots)
        runs.append((fused is not None, adapter_slots is not None))
        return fused

    monkeypatch.setattr(accelerator, "for_step", counted)
    return runs


def check_fused_adapter_rows(runner, monkeypatch, atol: float, rows=DECODE_ROWS) -> None:
    """Decode steps with adapter rows run in the fused stack (it is asked, with the rows' slots,
    and takes them) and equal the layer-by-layer path within fp32 tolerance."""
    torch.set_num_threads(2)
    seqs = prefilled(runner, rows)
    accelerator = runner.accelerator
    runs = counting_runs(accelerator, monkeypatch)
    try:
        for _ in range(3):  # the same step twice writes the same K/V to the same slots
            runner.accelerator = None
            reference = runner.forward(decode_step(seqs))  # layer by layer, [8, V]
            runner.accelerator = accelerator
            fused = runner.forward(decode_step(seqs))
            assert runs[-1] == (True, True), "the mixed-adapter decode step did not run fused"
            assert (fused - reference).abs().max().item() <= atol
            assert torch.equal(fused.argmax(-1), reference.argmax(-1))
            seqs = {
                rid: (ids + [int(row.argmax())], table, n, a)
                for (rid, (ids, table, n, a)), row in zip(seqs.items(), fused, strict=True)
            }
    finally:
        torch.set_num_threads(1)


def test_fused_stack_runs_adapter_rows(lora_dirs, monkeypatch):
    check_fused_adapter_rows(lora_runner(lora_dirs), monkeypatch, atol=1e-5)


@pytest.mark.parametrize("arch", ["phi", "falcon_40b"])
def test_fused_stack_adapter_rows_in_every_block_kind(
    arch, tiny_model_factory, tmp_path, monkeypatch
):
    """The adapter's shrink runs where each block kind computes a linear's input: parallel (phi:
    the MLP reads the input norm) and parallel with two norms (Falcon 40B); sequential blocks
    are the tiny Llama's above (a sandwich computes the MLP's input where they do)."""
    base = tiny_model_factory(arch)
    adapter = make_adapter(
        base, tmp_path / "a", seed=3, r=4, lora_alpha=8, target_modules="all-linear"
    )
    runner = make_runner(base, lora_adapters=f"a={adapter}")
    assert runner.accelerator is not None and runner.accelerator.num_adapters == 1
    rows = [(None, 5), ("a", 9), ("a", 3), (None, 17), ("a", 12), ("a", 20), (None, 2)]
    check_fused_adapter_rows(runner, monkeypatch, 1e-5, rows)


def test_fused_stack_adapter_rows_on_quantized_base(lora_dirs, monkeypatch):
    """int8 base codes run with int8 activations in the stack; the LoRA deltas stay fp32."""
    runner = lora_runner(lora_dirs, quantize="eetq", quantize_activations="int8")
    layers = runner.model.fused_decode_layers()
    assert all(any(k.endswith(".codes") for k in tensors) for _, tensors in layers)
    check_fused_adapter_rows(runner, monkeypatch, atol=1e-4)


def test_fused_stack_declines_adapters_it_does_not_hold(lora_dirs, monkeypatch, caplog):
    """An adapted linear whose LoRA the stack was not handed (as for a linear outside it): steps
    with adapter rows run layer by layer, the reason logged once; base-only steps stay fused."""
    runner = lora_runner(lora_dirs)
    layers = runner.model.fused_decode_layers()
    layers[0][1].pop(next(k for k in layers[0][1] if ".lora" in k and k.endswith(".a")))
    monkeypatch.setattr(runner.model, "fused_decode_layers", lambda: layers)
    kernels = load_cpu_kernels()
    runner.accelerator = FusedDecodeStack.for_model(runner.model, kernels)
    assert runner.accelerator.num_adapters == 0 and runner.accelerator.lora_off
    seqs = prefilled(runner)
    runs = counting_runs(runner.accelerator, monkeypatch)
    with caplog.at_level(logging.INFO, logger="pytgi.backends.cpu.fused_decode"):
        for _ in range(2):
            runner.forward(decode_step(seqs))
    assert runs == [(False, True)] * 2
    declined = [r for r in caplog.records if "adapter rows run layer by layer" in r.message]
    assert len(declined) == 1
    runner.forward(decode_step(seqs, only=[rid for rid in seqs if seqs[rid][3] is None]))
    assert runs[-1] == (True, False)


def test_fused_stack_runs_adapter_rows_of_a_verify_step(lora_dirs, monkeypatch):
    """A speculative verify step (4 queries per request after cached keys) with adapter rows runs
    in the stack and equals the layer-by-layer path within fp32 tolerance."""
    runner = lora_runner(lora_dirs)
    seqs = prefilled(runner)
    verify = step(
        *(
            scheduled(
                rid,
                ids + prompt(3, seed=60 + i),
                len(ids) - 1,
                len(ids) + 3,
                table,
                num_prompt=n,
                adapter_id=a,
            )  # fmt: skip
            for i, (rid, (ids, table, n, a)) in enumerate(seqs.items())
        )
    )
    accelerator, runs = runner.accelerator, counting_runs(runner.accelerator, monkeypatch)
    runner.accelerator = None
    reference = runner.forward(verify)
    runner.accelerator = accelerator
    fused = runner.forward(verify)
    assert runs == [(True, True)]
    assert (fused - reference).abs().max().item() <= 1e-5


def test_fused_stack_adapter_rows_are_row_invariant(lora_dirs):
    """A row's logits in the fused stack do not depend on the step's other rows: base rows are
    bit-identical with or without adapter rows beside them, adapter rows alone or mixed, on one
    thread or two."""
    runner = lora_runner(lora_dirs)
    seqs = prefilled(runner)
    torch.set_num_threads(2)
    try:
        mixed = runner.forward(decode_step(seqs))
        rids = list(seqs)
        base_rows = [rid for rid in rids if seqs[rid][3] is None]
        alone = runner.forward(decode_step(seqs, only=base_rows))
        assert torch.equal(alone, mixed[[rids.index(r) for r in base_rows]])
        for rid in ("r1", "r3"):  # an adapter row alone
            single = runner.forward(decode_step(seqs, only=[rid]))
            assert torch.equal(single[0], mixed[rids.index(rid)])
        torch.set_num_threads(1)
        assert torch.equal(runner.forward(decode_step(seqs)), mixed)
    finally:
        torch.set_num_threads(1)


def test_parse_lora_adapters():
    assert parse_lora_adapters("a=/x, org/repo@v1 ,org/other") == (
        LoRAAdapter("a", "/x"),
        LoRAAdapter("org/repo", "org/repo", "v1"),
        LoRAAdapter("org/other", "org/other"),
    )
    with pytest.raises(ConfigError, match="given twice"):
        parse_lora_adapters("a=/x,a=/y")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_dora": True}, "use_dora"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_unsupported_adapters_are_refused(lora_dirs, tmp_path, change, message):
    base, adapters = lora_dirs
    source = adapters["qv-rslora"]
    config = json.loads((source / "adapter_config.json").read_text()) | change
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    (tmp_path / "adapter_model.safetensors").write_bytes(
        (source / "adapter_model.safetensors").read_bytes()
    )
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(base), lora_adapters=f"bad={tmp_path}", num_blocks=16)


@pytest.mark.tp
def test_tensor_parallel_adapters_match_one_shard(lora_dirs):
    """Two gloo ranks (A and B sharded as TGI shards them) give the one-process tokens."""
    import dataclasses
    import socket

    from pytgi.config import ParallelConfig
    from pytgi.runtime.build import engine_config

    base, adapters = lora_dirs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ",".join(f"{k}={d}" for k, d in adapters.items())
    config = engine_config(str(base), lora_adapters=spec, num_blocks=64, num_threads=1)
    config = dataclasses.replace(config, parallel=ParallelConfig(num_shard=2, master_port=port))
    requests = [
        (None, prompt(9, 21)),
        *((a, prompt(6 + i, 30 + i)) for i, a in enumerate(adapters)),
    ]
    ids, adapter_ids = [i for _, i in requests], [a for a, _ in requests]
    refs = {None: load_hf(base), **{k: merged_model(base, d) for k, d in adapters.items()}}
    llm = LLM.from_config(config)
    try:
        outs = llm.generate(
            ids, max_new_tokens=NEW_TOKENS, ignore_eos=True, adapter_ids=adapter_ids
        )
    finally:
        llm.close()
    for out, (a, i) in zip(outs, requests, strict=True):
        tokens, logprobs = hf_greedy_logprobs(refs[a], i, NEW_TOKENS)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=2e-3)
