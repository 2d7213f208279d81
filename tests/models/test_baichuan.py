"""Baichuan has no class in transformers (the hub ships remote code, which pytgi does not run), so
its tests write a tiny Llama (one KV head per query head, as Baichuan has) into Baichuan's
checkpoint layout (models/baichuan.py: W_pack, config.json with model_type "baichuan" and an
auto_map to code that is not there) and require:

- Baichuan-7B's layout (rotary): the same tokens and bitwise the same logprobs as the Llama;
- Baichuan 2's NormHead (vocabulary 125696): LM-head rows stored at any scale give the output of
  the Llama whose head rows are unit-norm;
- Baichuan-13B's layout (ALiBi, not rotary): the tokens and logprobs of transformers' Llama with
  its rotary turned off and the ALiBi bias added to its attention mask, by full forwards.

Every run goes through the engine with 4-token blocks and a 16-token step budget (chunked prefill,
decode rows mixed with prefills) and a prefix-cache hit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from models.runner_utils import load_hf, prompt
from safetensors.torch import load_file, save_file

from pytgi.runtime.llm import LLM

NEW_TOKENS = 32
SHARED = prompt(20, 1)
PROMPTS = [prompt(5, 2), SHARED + prompt(7, 3), prompt(23, 4), SHARED + prompt(3, 5)]
CONFIG_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_hidden_layers",
    "rms_norm_eps",
    "vocab_size",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def write_baichuan(llama_dir: Path, out: Path, architecture: str, scale_head_rows=False) -> Path:
    """The Llama checkpoint in Baichuan's layout (optionally with its LM-head rows rescaled)."""
    llama = json.loads((llama_dir / "config.json").read_text())
    tensors = load_file(llama_dir / "model.safetensors")
    for i in range(llama["num_hidden_layers"]):
        prefix = f"model.layers.{i}.self_attn."
        parts = [tensors.pop(f"{prefix}{name}_proj.weight") for name in "qkv"]
        tensors[f"{prefix}W_pack.weight"] = torch.cat(parts)  # [3 * hidden, hidden]
    if scale_head_rows:
        scales = torch.rand(llama["vocab_size"], 1, generator=torch.Generator().manual_seed(0))
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * (0.5 + 2 * scales)
    config = {key: llama[key] for key in CONFIG_KEYS}
    length = (
        "model_max_length" if architecture == "BaichuanForCausalLM" else "max_position_embeddings"
    )
    config |= {
        "architectures": [architecture],
        "model_type": "baichuan",
        "auto_map": {
            "AutoConfig": "configuration_baichuan.BaichuanConfig",
            "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM",
        },
        length: llama["max_position_embeddings"],
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(llama_dir / name, out / name)
    return out


def generate(model_dir: Path):
    """Greedy outputs of PROMPTS through the engine; checks the prefix-cache hit."""
    torch.set_num_threads(1)
    llm = LLM(str(model_dir), block_size=4, num_blocks=64, max_batch_prefill_tokens=16)
    try:
        first = llm.generate(PROMPTS[:3], max_new_tokens=NEW_TOKENS, ignore_eos=True)
        hit = llm.generate(PROMPTS[3:], max_new_tokens=NEW_TOKENS, ignore_eos=True)
        assert hit[0].num_cached_tokens == 20
    finally:
        llm.close()
    return first + hit


@pytest.fixture(scope="module")
def mha_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama", num_key_value_heads=4)


def test_baichuan_7b_layout_is_the_llama(mha_llama, tmp_path):
    outputs = generate(write_baichuan(mha_llama, tmp_path / "7b", "BaiChuanForCausalLM"))
    for ours, ref in zip(outputs, generate(mha_llama), strict=True):
        assert ours.token_ids == ref.token_ids
        assert ours.logprobs == ref.logprobs  # the same arithmetic: bitwise


def test_baichuan2_norm_head(tiny_model_factory, tmp_path):
    """Vocabulary 125696 marks Baichuan 2: its LM-head rows are normalised when loaded."""
    llama = tiny_model_factory("llama", num_key_value_heads=4, vocab_size=125696)
    unit_rows = tmp_path / "unit-rows"
    shutil.copytree(llama, unit_rows)
    tensors = load_file(unit_rows / "model.safetensors")
    tensors["lm_head.weight"] = torch.nn.functional.normalize(tensors["lm_head.weight"], dim=-1)
    save_file(tensors, unit_rows / "model.safetensors", metadata={"format": "pt"})
    ours = generate(write_baichuan(llama, tmp_path / "baichuan2", "BaiChuanForCausalLM", True))
    for out, ref in zip(ours, generate(unit_rows), strict=True):
        assert out.token_ids == ref.token_ids
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)


@torch.no_grad()
def alibi_reference(llama_dir: Path, ids: list[int], monkeypatch) -> tuple[list[int], list[float]]:
    """transformers' Llama without rotary, with slope_h * (key - query position) added to its
    scores (the published ALiBi slopes for 4 heads: 2^-2, 2^-4, 2^-6, 2^-8), greedy by full
    forwards: Baichuan-13B's attention."""
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", lambda q, k, *args: (q, k))
    model = load_hf(llama_dir)
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])
    tokens, logprobs = [], []
    for _ in range(NEW_TOKENS):
        n = len(ids) + len(tokens)
        distance = torch.arange(n) - torch.arange(n).unsqueeze(1)  # [n, n]: key - query
        bias = slopes[:, None, None] * distance  # [H, n, n]
        mask = bias.masked_fill(distance > 0, float("-inf"))[None]  # [1, H, n, n]
        logits = model(torch.tensor([ids + tokens]), attention_mask=mask).logits[0, -1]
        token = int(logits.argmax())
        tokens.append(token)
        logprobs.append(torch.log_softmax(logits, -1)[token].item())
    return tokens, logprobs


def test_baichuan_13b_layout_runs_alibi(mha_llama, tmp_path, monkeypatch):
    outputs = generate(write_baichuan(mha_llama, tmp_path / "13b", "BaichuanForCausalLM"))
    for out, ids in zip(outputs, PROMPTS, strict=True):
        tokens, logprobs = alibi_reference(mha_llama, ids, monkeypatch)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=2e-3)
