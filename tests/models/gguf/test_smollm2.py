"""The real model: SmolLM2-135M-Instruct Q4_1 (from the package registry), against transformers'
own GGUF loading of the same file: config, tokenizer, every tensor bit for bit, and pytgi's served
model (Q4_1 kernels) teacher-forced on held-out text against transformers' fp32 dequantisation.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models.runner_utils import load_runner, perplexity, teacher_forced_logits

from pytgi import envs
from pytgi.config import ModelConfig
from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.models.gguf.checkpoint import GGUFCheckpoint
from pytgi.models.resolve import resolve_model
from pytgi.tokenizer.chat_template import ChatTemplate
from pytgi.tokenizer.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "What is the capital of France? Paris, since 987.",
    "  def f(x):\n\treturn x ** 2  # squares",
    "café naïve 日本語 🙂 <|im_start|> <|im_end|>",
]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
# written for this repository in 2026, after SmolLM2 was trained
HELDOUT_TEXT = Path(__file__).parents[2] / "fixtures" / "heldout_docs.txt"
HELDOUT_TOKENS = 512


@pytest.fixture(scope="module")
def checkpoint(smollm2_gguf) -> GGUFCheckpoint:
    return GGUFCheckpoint(smollm2_gguf)


def test_config(checkpoint, smollm2_gguf):
    from transformers import AutoConfig

    config = checkpoint.hf_config
    reference = AutoConfig.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    fields = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    )
    assert {f: getattr(config, f) for f in fields} == {f: getattr(reference, f) for f in fields}
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings and config.rope_scaling is None
    assert config.architectures == ["LlamaForCausalLM"]


def test_tokenizer_against_transformers(checkpoint, smollm2_gguf, tmp_path):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)
    tokenizer = Tokenizer.from_dir(checkpoint.write_hf_files(tmp_path))
    for text in TEXTS:
        expected = reference(text, add_special_tokens=False).input_ids
        assert tokenizer.encode(text, add_special_tokens=False).ids == expected, text
        assert tokenizer.decode(expected) == reference.decode(expected)
    # the file says add_bos_token = false and EOS = <|im_end|>; transformers' GGUF tokenizer
    # prepends <|im_start|> and calls it both BOS and EOS
    assert tokenizer.encode("Hello").ids == tokenizer.encode("Hello", add_special_tokens=False).ids
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer.eos_token_ids == (2,) and tokenizer.pad_token_id == 2
    template = ChatTemplate.from_dir(tmp_path, bos_token=tokenizer.bos_token)
    expected = reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert template.render(MESSAGES) == expected
    assert expected.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def reference(smollm2_gguf):
    """transformers' own loading of the file: every tensor dequantised to fp32 (the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_every_tensor_equals_transformers_dequantized_model(checkpoint, reference):
    state = reference.state_dict()
    assert checkpoint.tensor_types() == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    names = set()
    for name, value in checkpoint.iter_weights():
        names.add(name)
        if name.endswith("norm.weight"):
            assert value.dtype == torch.float32
        else:
            assert isinstance(value, QuantizedWeight), name
            value = value.dequantize()
        assert torch.equal(value.view(torch.int32), state[name].view(torch.int32)), name
    assert set(state) - names == {"lm_head.weight"}  # tied to the embedding
    assert len(names) == 272


@pytest.fixture(scope="module")
def served_dir(smollm2_gguf) -> Path:
    """The model directory pytgi serves the file from (config and tokenizer written once)."""
    return resolve_model(ModelConfig(model_id=str(smollm2_gguf), cache_dir=envs.cache_dir()))


@pytest.fixture(scope="module")
def heldout(served_dir, reference) -> tuple[list[int], torch.Tensor]:
    """(token ids, transformers' fp32 logits [T, V]) of the held-out text."""
    ids = Tokenizer.from_dir(served_dir).encode(HELDOUT_TEXT.read_text()).ids[:HELDOUT_TOKENS]
    assert len(ids) == HELDOUT_TOKENS
    with torch.inference_mode():
        logits = reference(torch.tensor([ids])).logits[0].float()
    return ids, logits


# activations -> (min top-1 agreement, max |perplexity change|, max logits RMS error relative to
# the reference's RMS, max logit gap of a flipped top-1). pytgi's weights are the file's codes,
# bit for bit (test above); what is left is the activations. fp32: only the summation order
# differs from transformers' (measured: 100 % top-1, perplexity equal to 5 digits, RMS error
# < 1e-5). int8, the default: each row is quantised per 32-wide block (relative error up to
# 1/254 of the block's largest value per element), which moves the logits by ~1.7 % RMS and
# flips the top-1 where the reference's two best logits are that close (measured on this text:
# 93.6 % top-1, perplexity 90.52 against 89.96, +0.62 %, RMS error 0.017, flips between logits
# at most 0.30 apart). The bounds leave room for other kernels' summation order, not for a wrong
# weight (which moves every logit).
FIDELITY_BOUNDS = {"fp32": (0.998, 0.001, 1e-4, 0.01), "int8": (0.90, 0.02, 0.03, 1.0)}


@pytest.mark.parametrize("acts", ["int8", "fp32"])
def test_served_model_matches_transformers_fp32_reference(served_dir, heldout, acts, monkeypatch):
    """Teacher-forced on held-out text: top-1 agreement and perplexity against transformers' fp32
    dequantisation of the same file, through the runner that serves it (Q4_1 kernels, quantized
    tied head and embedding)."""
    monkeypatch.setenv("PYTGI_QUANT_ACTIVATIONS", acts)
    ids, expected = heldout
    runner = load_runner(served_dir, num_tokens=len(ids))
    quantized = [m for m in runner.model.modules() if getattr(m, "quant_packed", None) is not None]
    assert len(quantized) == 30 * 4 + 1  # every linear layer and the (tied) head
    logits = teacher_forced_logits(runner, ids)
    top1 = (logits.argmax(-1) == expected.argmax(-1)).float().mean().item()
    ppl, ref_ppl = perplexity(logits, ids), perplexity(expected, ids)
    rel_rms = ((logits - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()
    # where the top-1 differs: how far below the reference's best logit pytgi's choice lies
    ours = logits.argmax(-1, keepdim=True)
    gaps = expected.max(-1).values - expected.gather(-1, ours).squeeze(-1)  # [T], 0 where equal
    print(
        f"{acts} activations: top-1 {top1:.4f}, perplexity {ppl:.3f} against {ref_ppl:.3f}, "
        f"logits rel. RMS error {rel_rms:.5f}, largest flipped gap {gaps.max().item():.3f}"
    )
    min_top1, max_ppl_change, max_rms, max_gap = FIDELITY_BOUNDS[acts]
    assert top1 >= min_top1
    assert abs(ppl / ref_ppl - 1) <= max_ppl_change
    assert rel_rms <= max_rms
    assert gaps.max().item() <= max_gap  # flips only between (nearly) tied tokens
