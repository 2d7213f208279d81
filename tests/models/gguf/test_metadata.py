"""Config and tokenizer from GGUF metadata: round trip of a tiny Llama's, and transformers' own
GGUF readings as the reference."""

from __future__ import annotations

import json

import gguf
import pytest
from fixtures.gguf_files import write_llama_gguf
from fixtures.tiny_models import CORPUS
from tokenizers import Tokenizer as HFTokenizer

from pytgi.models.gguf.checkpoint import GGUFCheckpoint
from pytgi.tokenizer.chat_template import ChatTemplate
from pytgi.tokenizer.tokenizer import Tokenizer

TEXTS = [*CORPUS.splitlines(), "<|user|>\nHi</s>", "  leading spaces", "", "日本語 🙂 café"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]


def test_metadata_equals_transformers_load_gguf_checkpoint(tiny_gguf):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path, _ = tiny_gguf
    expected = load_gguf_checkpoint(str(path), return_tensors=False)
    meta = GGUFCheckpoint(path).metadata
    assert meta.architecture == "llama"
    assert meta.config == expected["config"]
    assert meta.tokenizer == expected["tokenizer"]
    assert meta.tokenizer_config == expected["tokenizer_config"]


@pytest.mark.parametrize("arch", ["llama", "llama_tied"])
def test_config_round_trip(gguf_factory, arch):
    path, model_dir = gguf_factory(arch)
    original = json.loads((model_dir / "config.json").read_text())
    config = GGUFCheckpoint(path).hf_config
    assert config.architectures == ["LlamaForCausalLM"] and config.model_type == "llama"
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "rope_theta",
    ):
        assert getattr(config, key) == original[key], key
    assert config.rms_norm_eps == pytest.approx(original["rms_norm_eps"], rel=1e-7)  # float32
    assert config.head_dim == original["hidden_size"] // original["num_attention_heads"]
    assert config.rope_scaling is None


@pytest.mark.parametrize(
    ("arch", "kind"), [("llama_linear_rope", "LINEAR"), ("llama_yarn_rope", "YARN")]
)
def test_rope_scaling_round_trip(tiny_model_factory, tmp_path, arch, kind):
    model_dir = tiny_model_factory(arch)
    scaling = json.loads((model_dir / "config.json").read_text())["rope_scaling"]

    def add_scaling(writer: gguf.GGUFWriter) -> None:
        writer.add_rope_scaling_type(getattr(gguf.RopeScalingType, kind))
        writer.add_rope_scaling_factor(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])

    path = write_llama_gguf(model_dir, tmp_path / "m.gguf", extra=add_scaling)
    config = GGUFCheckpoint(path).hf_config
    assert {k: v for k, v in config.rope_scaling.items() if k != "type"} == scaling


def test_tokenizer_encodes_as_the_original(tiny_gguf):
    path, model_dir = tiny_gguf
    original = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
    ours = GGUFCheckpoint(path).tokenizer.backend
    for text in TEXTS:
        for special in (True, False):
            expected = original.encode(text, add_special_tokens=special).ids
            assert ours.encode(text, add_special_tokens=special).ids == expected, (text, special)
        ids = original.encode(text).ids
        assert ours.decode(ids, skip_special_tokens=False) == original.decode(
            ids, skip_special_tokens=False
        )


def test_tokenizer_equals_transformers_auto_tokenizer(tiny_gguf):
    """Same ids as transformers' GGUF tokenizer without special tokens; with them, the metadata's
    add_bos_token decides (transformers always prepends its BOS)."""
    from transformers import AutoTokenizer

    path, _ = tiny_gguf
    reference = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer = GGUFCheckpoint(path).tokenizer
    for text in TEXTS:
        expected = reference(text, add_special_tokens=False).input_ids
        assert tokenizer.backend.encode(text, add_special_tokens=False).ids == expected
    assert tokenizer.config["chat_template"] == reference.chat_template
    assert tokenizer.config["eos_token"] == "</s>"  # transformers' GGUF tokenizer says "<s>"


def test_hf_files_load_in_pytgi(tiny_gguf, tmp_path):
    path, model_dir = tiny_gguf
    out = GGUFCheckpoint(path).write_hf_files(tmp_path / "hf")
    tokenizer, original = Tokenizer.from_dir(out), Tokenizer.from_dir(model_dir)
    for attr in ("bos_token", "eos_token", "pad_token", "eos_token_ids", "special_ids"):
        assert getattr(tokenizer, attr) == getattr(original, attr), attr
    assert tokenizer.model_max_length == 512
    for text in TEXTS:
        assert tokenizer.encode(text) == original.encode(text)
    kwargs = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    rendered = ChatTemplate.from_dir(out, **kwargs).render(MESSAGES)
    assert rendered == ChatTemplate.from_dir(model_dir, **kwargs).render(MESSAGES)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation == {"eos_token_id": 2, "bos_token_id": 1, "pad_token_id": 3}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 384


def test_end_of_turn_token_is_an_eos(tiny_model_factory, tmp_path):
    def add_eot(writer: gguf.GGUFWriter) -> None:
        writer.add_eot_token_id(6)

    path = write_llama_gguf(tiny_model_factory("llama"), tmp_path / "m.gguf", extra=add_eot)
    tokenizer = Tokenizer.from_dir(GGUFCheckpoint(path).write_hf_files(tmp_path / "hf"))
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_ids == (2, 6)


def test_add_bos_false_adds_nothing(tiny_model_factory, tmp_path):
    def no_bos(writer: gguf.GGUFWriter) -> None:
        writer.add_add_bos_token(False)

    path = write_llama_gguf(tiny_model_factory("llama"), tmp_path / "m.gguf", extra=no_bos)
    tokenizer = GGUFCheckpoint(path).tokenizer
    assert tokenizer.config["add_bos_token"] is False
    backend = tokenizer.backend
    assert backend.encode("hello").ids == backend.encode("hello", add_special_tokens=False).ids
