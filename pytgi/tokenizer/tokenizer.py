"""`Tokenizer`: an HF fast tokenizer loaded from a model directory, with its special-token facts.

Loads `tokenizer.json` with the `tokenizers` library (no transformers, no torch). A directory with
only a slow tokenizer (e.g. `tokenizer.model`) is converted once through transformers, as TGI's
router does. Special tokens come from `tokenizer_config.json` (string or `{content: ...}` objects).
EOS ids follow TGI (§7): a *list* `eos_token_id` in `generation_config.json` replaces the
tokenizer's EOS.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from pytgi.errors import ModelLoadError

# tokenizer_config.json uses ~1e30 for "no limit"
_UNBOUNDED_MAX_LENGTH = 10**12
_SLOW_TOKENIZER_FILES = (
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "tekken.json",
)


@dataclass(frozen=True)
class Encoded:
    """Token ids with the byte offsets (into the UTF-8 input) each token covers."""

    ids: list[int]
    offsets: list[tuple[int, int]]


class Tokenizer:
    """Encode/decode and the special-token facts of one model."""

    def __init__(
        self, backend: HFTokenizer, config: dict[str, Any], eos_token_ids: tuple[int, ...]
    ):
        self.backend = backend
        self.config = config
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.pad_token = _token_content(config.get("pad_token"))
        self.bos_token_id = self._id_or_none(self.bos_token)
        self.eos_token_id = self._id_or_none(self.eos_token)
        self.pad_token_id = self._id_or_none(self.pad_token)
        self.special_ids = frozenset(
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        )
        self.eos_token_ids = eos_token_ids or _single(self.eos_token_id)
        self.model_max_length = _max_length(config.get("model_max_length"))
        # where the chat template is looked up (set by from_dir)
        self.model_dir: Path | None = None
        self.config_path: Path | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path, *, config_path: str | Path | None = None) -> Tokenizer:
        """Load from a model directory; `config_path` overrides `tokenizer_config.json`."""
        model_dir = Path(model_dir)
        config_file = Path(config_path) if config_path else model_dir / "tokenizer_config.json"
        config = _read_json(config_file)
        backend = _load_backend(model_dir)
        gen_config = _read_json(model_dir / "generation_config.json")
        eos = gen_config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ()
        tok = cls(backend, config, eos_ids)
        if not tok.eos_token_ids and isinstance(eos, int):
            tok.eos_token_ids = (eos,)
        tok.model_dir = model_dir
        tok.config_path = Path(config_path) if config_path else None
        return tok

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Encoded:
        enc = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return Encoded(list(enc.ids), _char_to_byte_offsets(text, enc.offsets))

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)


def _load_backend(model_dir: Path) -> HFTokenizer:
    path = model_dir / "tokenizer.json"
    if path.is_file():
        return HFTokenizer.from_file(str(path))
    if not any((model_dir / name).is_file() for name in _SLOW_TOKENIZER_FILES):
        raise ModelLoadError(f"No tokenizer found in {model_dir} (no tokenizer.json)")
    return _convert_slow_tokenizer(model_dir)


def _convert_slow_tokenizer(model_dir: Path) -> HFTokenizer:
    """No tokenizer.json: let transformers build the fast tokenizer once (as TGI's router does)."""
    from transformers import AutoTokenizer

    try:
        hf_tok = AutoTokenizer.from_pretrained(str(model_dir), use_fast=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Cannot load a tokenizer from {model_dir}: {exc}") from exc
    if not getattr(hf_tok, "is_fast", False):
        raise ModelLoadError(f"No fast tokenizer can be built for {model_dir}")
    with tempfile.TemporaryDirectory() as tmp:
        hf_tok.save_pretrained(tmp)
        return HFTokenizer.from_file(str(Path(tmp) / "tokenizer.json"))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"Cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as AddedToken objects."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _single(token_id: int | None) -> tuple[int, ...]:
    return () if token_id is None else (token_id,)


def _max_length(value: Any) -> int | None:
    if isinstance(value, (int, float)) and 0 < value < _UNBOUNDED_MAX_LENGTH:
        return int(value)
    return None


def _char_to_byte_offsets(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`tokenizers` reports character offsets for Python strings; TGI's /tokenize reports bytes."""
    if text.isascii():
        return [tuple(o) for o in offsets]
    byte_pos = [0]
    for ch in text:
        byte_pos.append(byte_pos[-1] + len(ch.encode("utf-8")))
    last = len(text)
    return [(byte_pos[min(s, last)], byte_pos[min(e, last)]) for s, e in offsets]
