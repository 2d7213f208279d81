"""Multi-LoRA: adapters made with PEFT, served in one batch with the base model, against
transformers with PEFT's merged model for each adapter (identical greedy tokens, close logprobs)."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures.lora_adapters import ADAPTERS, make_adapter, merged_model
from models.runner_utils import hf_greedy_logprobs, load_hf, prompt

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
