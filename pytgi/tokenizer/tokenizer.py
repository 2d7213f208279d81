"""`Tokenizer`: an HF fast tokenizer loaded from a model directory, with its special-token facts.

Loads `tokenizer.json` with the `tokenizers` library (no transformers, no torch). A directory with
only a slow tokenizer (e.g. `tokenizer.model`) is converted once through transformers, as TGI's
router does. Special tokens come from `tokenizer_config.json` (string or `{content: ...}` objects).
EOS ids: a *list* `eos_token_id` in `generation_config.json` replaces the tokenizer's EOS (TGI,
TGI_COMPATIBILITY.md §13); a single id there that differs from the tokenizer's EOS is added to it,
as transformers and vLLM do (TGI uses only the tokenizer's), so a chat model whose converted
tokenizer names another EOS still stops at the end of its turn.

Long texts can be measured without tokenizing them whole: `count_tokens` counts piece by piece and
stops past a limit, and `encode_tail` tokenizes only the end a truncation keeps, so the work (and
memory) spent on a prompt that is refused or truncated is bounded by the limits, not by the body.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from pytgi.errors import ModelLoadError

# pieces of text tokenized separately by count_tokens / encode_tail, cut at whitespace
PIECE_CHARS = 4096
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
        if isinstance(eos, int) and eos not in tok.eos_token_ids:
            tok.eos_token_ids = (*tok.eos_token_ids, eos)
        tok.model_dir = model_dir
        tok.config_path = Path(config_path) if config_path else None
        return tok

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Encoded:
        enc = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return Encoded(list(enc.ids), _char_to_byte_offsets(text, enc.offsets))

    def count_tokens(
        self, text: str, *, add_special_tokens: bool = True, stop_after: int | None = None
    ) -> int:
        """About how many tokens `text` has, from pieces cut at whitespace (a cut can shift the
        count by a token or two); once more than `stop_after` are counted, counting stops and the
        partial count is returned."""
        total = self._num_special_tokens() if add_special_tokens else 0
        for piece in _pieces(text, 0, len(text)):
            total += len(self.backend.encode(piece, add_special_tokens=False))
            if stop_after is not None and total > stop_after:
                break
        return total

    def encode_tail(
        self, text: str, num_tokens: int, *, add_special_tokens: bool = True
    ) -> list[int]:
        """The last `num_tokens` ids of `text`'s encoding, tokenizing only as much of its end as
        they need (plus a margin, so the cut where tokenizing starts does not reach them)."""
        wanted, start, counted = num_tokens + PIECE_CHARS // 8, len(text), 0
        while start > 0 and counted < wanted:
            piece_start = _piece_start(text, start)
            counted += len(self.backend.encode(text[piece_start:start], add_special_tokens=False))
            start = piece_start
        tail = text[start:]
        return self.backend.encode(tail, add_special_tokens=add_special_tokens).ids[-num_tokens:]

    def _num_special_tokens(self) -> int:
        processor = self.backend.post_processor
        return processor.num_special_tokens_to_add(False) if processor is not None else 0

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


def _piece_start(text: str, end: int) -> int:
    """Where the piece of `text` that ends at `end` starts: at a whitespace after at most
    PIECE_CHARS characters (a word is never cut unless it is longer than half of that)."""
    start = max(end - PIECE_CHARS, 0)
    if start == 0:
        return 0
    cut = _last_space(text, start, start + PIECE_CHARS // 2)
    return cut if cut is not None else start


def _pieces(text: str, start: int, end: int):
    while start < end:
        stop = min(start + PIECE_CHARS, end)
        if stop < end:
            cut = _last_space(text, stop - PIECE_CHARS // 2, stop)
            stop = cut if cut is not None and cut > start else stop
        yield text[start:stop]
        start = stop


def _last_space(text: str, lo: int, hi: int) -> int | None:
    """The index of the last space or newline in text[lo:hi] (a piece then starts with it)."""
    cut = max(text.rfind(" ", lo, hi), text.rfind("\n", lo, hi))
    return cut if cut >= 0 else None


def _char_to_byte_offsets(text: str, offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`tokenizers` reports character offsets for Python strings; TGI's /tokenize reports bytes."""
    if text.isascii():
        return [tuple(o) for o in offsets]
    byte_pos = [0]
    for ch in text:
        byte_pos.append(byte_pos[-1] + len(ch.encode("utf-8")))
    last = len(text)
    return [(byte_pos[min(s, last)], byte_pos[min(e, last)]) for s, e in offsets]
