"""Tokenizer fixtures built offline from the shared corpus.

A byte-level BPE (GPT-2/Llama-3 style) and a SentencePiece-style BPE with byte fallback and a
Metaspace-like decoder (Llama-2/Mistral style).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.tiny_models import CORPUS, SPECIAL_TOKENS, build_tokenizer

from pytgi.tokenizer.tokenizer import Tokenizer


def build_sentencepiece_style(path: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tok.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = _with_byte_fallback_vocab(tok)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "model_max_length": 1e30}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 6]}))


def _with_byte_fallback_vocab(tok):
    """Add the 256 `<0xXX>` byte tokens as plain vocabulary entries (SentencePiece models do)."""
    from tokenizers import Tokenizer as HFTokenizer

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return HFTokenizer.from_str(json.dumps(data))


@pytest.fixture(scope="session")
def bytelevel_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok-bytelevel")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def sp_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok-sp")
    build_sentencepiece_style(path)
    return path


@pytest.fixture(scope="session")
def bytelevel_tok(bytelevel_dir) -> Tokenizer:
    return Tokenizer.from_dir(bytelevel_dir)


@pytest.fixture(scope="session")
def sp_tok(sp_dir) -> Tokenizer:
    return Tokenizer.from_dir(sp_dir)
