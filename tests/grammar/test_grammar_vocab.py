"""GrammarVocab refuses a tokenizer whose tokens llguidance would read differently from the
tokenizer itself (masks would then not say what the tokens are); the engine then turns
constrained decoding off instead of producing wrong masks. The decoder chain transformers' GGUF
converter writes for a byte-level vocabulary (ByteFallback, Fuse, Replace, then ByteLevel), which
llguidance misreads, is handed to it as the ByteLevel it amounts to: GGUF models keep grammars."""

from __future__ import annotations

import json
import shutil

import pytest

from pytgi.grammar import GrammarVocab
from pytgi.runtime.llm import LLM

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


# a decoder llguidance does not apply (it reads the tokens as plain ByteLevel): "e" decodes as "E"
MISREAD_DECODER = {
    "type": "Sequence",
    "decoders": [
        GGUF_CONVERTER_DECODER["decoders"][-1],
        {"type": "Replace", "pattern": {"String": "e"}, "content": "E"},
    ],
}


def with_decoder(model_dir, tmp_path_factory, decoder):
    path = tmp_path_factory.mktemp("decoder") / "model"
    shutil.copytree(model_dir, path)
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["decoder"] = decoder
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    return path


@pytest.fixture(scope="module")
def misread_model_dir(tiny_llama_dir, tmp_path_factory):
    return with_decoder(tiny_llama_dir, tmp_path_factory, MISREAD_DECODER)


def test_the_gguf_converters_decoder_chain_reads_as_byte_level(demo_model_dir, tmp_path_factory):
    from pytgi.tokenizer.tokenizer import Tokenizer

    gguf_dir = with_decoder(demo_model_dir, tmp_path_factory, GGUF_CONVERTER_DECODER)
    tokenizer = Tokenizer.from_dir(gguf_dir)
    vocab = GrammarVocab.from_model_dir(gguf_dir)  # no error: every checked token reads the same
    ids = tokenizer.encode('In the beginning God created, {"a": 1}', add_special_tokens=False)
    assert vocab.decode(ids.ids) == tokenizer.backend.decode(ids.ids)


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
