"""`GrammarVocab`: the model's vocabulary as the grammar engine sees it, built once per engine.

llguidance reads the tokenizer's `tokenizer.json` (byte-level BPE, SentencePiece byte fallback,
added tokens) and precomputes the token trie every mask walks. Building it takes ~0.5 s for a
49k vocabulary and ~1-2 s for 128k (docs/PERFORMANCE.md, "Grammar engines"): do it once, at
engine start-up, never per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import llguidance

if TYPE_CHECKING:
    from pytgi.tokenizer.tokenizer import Tokenizer


class GrammarVocab:
    """Token ids ↔ bytes for masks, and the EOS ids that end a grammar.

    `vocab_size` is the width of the token masks: the model's logits size when given (a model may
    pad its vocabulary past the tokenizer's), else the tokenizer's. Ids past the tokenizer's
    vocabulary are never allowed; EOS ids are allowed exactly where the grammar may end.
    """

    def __init__(
        self, tokenizer_json: str, eos_token_ids: Sequence[int], vocab_size: int | None = None
    ):
        if not eos_token_ids:
            raise ValueError("constrained decoding needs at least one EOS token id")
        self.eos_token_ids = tuple(eos_token_ids)
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )
        self.vocab_size: int = self.tokenizer.vocab_size

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, vocab_size: int | None = None) -> GrammarVocab:
        """From pytgi's tokenizer (any model directory it loads, slow tokenizers converted)."""
        return cls(tokenizer.backend.to_str(), tokenizer.eos_token_ids, vocab_size)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, vocab_size: int | None = None) -> GrammarVocab:
        from pytgi.tokenizer.tokenizer import Tokenizer

        return cls.from_tokenizer(Tokenizer.from_dir(model_dir), vocab_size)

    @property
    def bitmask_width(self) -> int:
        """int32 words per token mask row: ceil(vocab_size / 32)."""
        return (self.vocab_size + 31) // 32

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode_str(list(token_ids))
