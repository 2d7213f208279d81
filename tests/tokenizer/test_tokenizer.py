"""Tokenizer loading: special tokens, EOS resolution (generation_config list wins), offsets."""

from __future__ import annotations

import json

import pytest

from pytgi.errors import ModelLoadError
from pytgi.tokenizer.tokenizer import Tokenizer


def test_bytelevel_special_tokens(bytelevel_tok):
    assert (bytelevel_tok.bos_token, bytelevel_tok.eos_token) == ("<s>", "</s>")
    assert (bytelevel_tok.bos_token_id, bytelevel_tok.eos_token_id, bytelevel_tok.pad_token_id) == (
        1,
        2,
        3,
    )
    assert bytelevel_tok.eos_token_ids == (2,)
    assert bytelevel_tok.is_special(1) and not bytelevel_tok.is_special(100)
    assert bytelevel_tok.model_max_length == 512


def test_generation_config_eos_list_replaces_tokenizer_eos(sp_tok):
    assert sp_tok.eos_token == "</s>"  # AddedToken object form in tokenizer_config.json
    assert sp_tok.eos_token_ids == (2, 6)
    assert sp_tok.model_max_length is None  # 1e30 means unbounded


def test_generation_config_int_eos_is_added_to_the_tokenizers(tmp_path, bytelevel_dir):
    """transformers and vLLM stop on both (TGI only on the tokenizer's)."""
    _copy_tokenizer(bytelevel_dir, tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (2, 5)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == (2,)


def test_encode_adds_bos_and_decode_skips_it(bytelevel_tok):
    with_bos = bytelevel_tok.encode("Hello world").ids
    without = bytelevel_tok.encode("Hello world", add_special_tokens=False).ids
    assert with_bos == [1] + without
    assert bytelevel_tok.decode(with_bos) == "<s>Hello world"
    assert bytelevel_tok.decode(with_bos, skip_special_tokens=True) == "Hello world"


def test_offsets_are_utf8_byte_offsets(bytelevel_tok):
    text = "café 日本"
    enc = bytelevel_tok.encode(text, add_special_tokens=False)
    raw = text.encode()
    assert enc.offsets[-1][1] == len(raw)
    spans = {raw[s:e].decode("utf-8", "replace") for s, e in enc.offsets}
    assert {"日", "本"} <= spans


def test_config_path_override(tmp_path, bytelevel_dir):
    override = tmp_path / "other_config.json"
    override.write_text(json.dumps({"bos_token": "<s>", "eos_token": "<|user|>"}))
    tok = Tokenizer.from_dir(bytelevel_dir, config_path=override)
    assert tok.eos_token == "<|user|>"
    assert tok.eos_token_ids == (tok.backend.token_to_id("<|user|>"),)


def test_missing_tokenizer_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError):
        Tokenizer.from_dir(tmp_path)


def test_malformed_config_is_a_load_error(tmp_path, bytelevel_dir):
    _copy_tokenizer(bytelevel_dir, tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="tokenizer_config.json"):
        Tokenizer.from_dir(tmp_path)


def _copy_tokenizer(src, dst):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((src / name).read_bytes())


def test_bounded_counting_and_tail_encoding_match_the_full_encoding():
    from pytgi.demo_model import demo_model_path

    tok = Tokenizer.from_dir(demo_model_path())
    text = " ".join(f"And the word{i % 97}, said he;\nverily" for i in range(3000))  # ~60k chars
    full = tok.encode(text).ids
    counted = tok.count_tokens(text)
    assert abs(counted - len(full)) <= len(text) // 4096 + 2  # a token or two per piece
    assert tok.count_tokens(text, stop_after=500) < 500 + 2000  # stopped within one piece
    for n in (1, 100, 5000):
        assert tok.encode_tail(text, n) == full[-n:]
    short = "In the beginning"
    assert tok.encode_tail(short, 100) == tok.encode(short).ids  # shorter than n: all of it
