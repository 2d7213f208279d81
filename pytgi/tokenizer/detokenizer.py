"""`IncrementalDetokenizer`: token ids in, text pieces out, one token at a time
(TGI_COMPATIBILITY.md §13).

TGI's prefix/read-offset algorithm: after each token, decode `ids[prefix:]` and `ids[prefix:read]`
and emit the difference. Decoding a window (not single tokens) keeps tokenizer-specific spacing
right (SentencePiece drops a leading space when decoding a lone token); holding back while the text
ends with U+FFFD keeps a multi-byte character split over byte-level tokens from ever being emitted
half-way. `flush()` releases what is still held when the sequence ends, so the concatenation of all
pieces equals the decode of the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# prompt tokens kept as decoding context (TGI: prefix offset starts at prompt_len - 5)
PROMPT_CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str: ...


class IncrementalDetokenizer:
    """Streams the text of generated tokens; one instance per sequence."""

    def __init__(
        self,
        decoder: Decoder,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = False,
    ):
        self._decoder = decoder
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._advance()
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text still held back (an incomplete or invalid character at the end), then reset."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._advance()
        return new_text[len(prefix_text) :]

    def _advance(self) -> None:
        """The old read offset becomes the new prefix; drop ids no window will decode again."""
        del self._ids[: self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._decoder.decode(self._ids[start:end], skip_special_tokens=self._skip_special)
