"""The real model: SmolLM2-135M-Instruct Q4_1 (from the package registry), against transformers'
own GGUF loading of the same file."""

from __future__ import annotations

import pytest
import torch

from pytgi.layers.quantization.quantized_weight import QuantizedWeight
from pytgi.models.gguf.checkpoint import GGUFCheckpoint
from pytgi.tokenizer.chat_template import ChatTemplate
from pytgi.tokenizer.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "What is the capital of France? Paris, since 987.",
    "  def f(x):\n\treturn x ** 2  # squares",
    "café naïve 日本語 🙂 <|im_start|> <|im_end|>",
]
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


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


@pytest.mark.slow
def test_every_tensor_equals_transformers_dequantized_model(checkpoint, smollm2_gguf):
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, torch_dtype=torch.float32
    )
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
