"""GrammarVocab refuses a tokenizer whose tokens llguidance would read differently from the
tokenizer itself (masks would then not say what the tokens are): the byte-level vocabulary that
transformers' GGUF converter writes with a ByteFallback-first decoder is one. The engine then
turns constrained decoding off instead of producing wrong masks."""

from __future__ import annotations

import json
import shutil

import pytest

from pytgi.engine.llm import LLM
from pytgi.grammar import GrammarVocab

# what transformers' GGUF tokenizer converter writes for a byte-level BPE (e.g. SmolLM2's GGUF)
GGUF_CONVERTER_DECODER = {
    "type": "Sequence",
    "decoders": [
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    ],
}


@pytest.fixture(scope="module")
def misread_model_dir(tiny_llama_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("misread") / "model"
    shutil.copytree(tiny_llama_dir, path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["decoder"] = GGUF_CONVERTER_DECODER
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return path


def test_real_tokenizers_read_the_same(tiny_tokenizer_dir, demo_model_dir):
    for model_dir in (tiny_tokenizer_dir, demo_model_dir):
        GrammarVocab.from_model_dir(model_dir)  # no error


def test_a_misread_vocabulary_is_refused(misread_model_dir):
    with pytest.raises(ValueError, match="differently from the tokenizer"):
        GrammarVocab.from_model_dir(misread_model_dir)


def test_the_engine_turns_grammars_off_for_it(misread_model_dir, caplog):
    llm = LLM(str(misread_model_dir), num_blocks=16, num_threads=1)
    try:
        assert not llm.core.cache_info.supports_grammar
    finally:
        llm.close()
    assert "constrained decoding is off" in caplog.text
