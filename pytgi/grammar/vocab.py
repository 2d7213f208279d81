"""`GrammarVocab`: the model's vocabulary as the grammar engine sees it, built once per engine.

llguidance reads the tokenizer's `tokenizer.json` (byte-level BPE, SentencePiece byte fallback,
added tokens) and precomputes the token trie every mask walks. Building it takes ~0.5 s for a
49k vocabulary and ~1-2 s for 128k (docs/PERFORMANCE.md, "Grammar engines"): do it once, at
engine start-up, never per request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import llguidance

if TYPE_CHECKING:
    import tokenizers

    from pytgi.tokenizer.tokenizer import Tokenizer

CHECKED_TOKENS = 2048  # tokens compared with the tokenizer's own decoding, spread over the vocab
MAX_MISREAD_FRACTION = 0.01
# transformers' GGUF converter writes this chain before a byte-level vocabulary's ByteLevel
# decoder; on such tokens (byte-alphabet strings: no `<0xNN>` pieces, no "▁") every step is the
# identity, but llguidance reads the chain as SentencePiece's and misreads every byte
GGUF_NO_OP_STEPS = (
    {"type": "ByteFallback"},
    {"type": "Fuse"},
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
)


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
        """From pytgi's tokenizer (any model directory it loads, slow tokenizers converted).

        Raises ValueError when llguidance reads the tokens' bytes differently from the tokenizer
        (a decoder it does not understand): its masks would not match what the tokens say.
        """
        tokenizer_json = byte_level_decoder(tokenizer.backend.to_str())
        vocab = cls(tokenizer_json, tokenizer.eos_token_ids, vocab_size)
        vocab.check_token_bytes(tokenizer.backend)  # the tokenizer's own decoder is the reference
        return vocab

    def check_token_bytes(self, backend: tokenizers.Tokenizer) -> None:
        """Compare llguidance's bytes of ~2k tokens spread over the vocabulary with the
        tokenizer's decoding of each after an anchor token (so that decoders that strip a
        leading space see it mid-text); raise ValueError if more than 1 % differ."""
        anchor = backend.encode("a", add_special_tokens=False).ids
        if not anchor:
            return
        anchor_text = backend.decode(anchor[-1:], skip_special_tokens=False)
        num_tokens = backend.get_vocab_size(with_added_tokens=False)
        step = max(1, num_tokens // CHECKED_TOKENS)
        ids = [t for t in range(0, num_tokens, step) if not self.tokenizer.is_special_token(t)]
        texts = backend.decode_batch([[anchor[-1], t] for t in ids], skip_special_tokens=False)
        checked, misread = 0, []
        for token_id, text in zip(ids, texts, strict=True):
            expected = text[len(anchor_text) :] if text.startswith(anchor_text) else None
            if expected is None or "\ufffd" in expected:  # part of a UTF-8 sequence
                continue
            checked += 1
            if self.tokenizer.decode_bytes([token_id]) != expected.encode():
                misread.append((token_id, expected))
        if len(misread) > MAX_MISREAD_FRACTION * checked:
            token_id, expected = misread[0]
            got = self.tokenizer.decode_bytes([token_id])
            raise ValueError(
                f"llguidance reads {len(misread)} of {checked} checked tokens differently from "
                f"the tokenizer (token {token_id}: {expected!r} read as {got!r}); its "
                "tokenizer.json decoder is not one llguidance understands"
            )

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


def byte_level_decoder(tokenizer_json: str) -> str:
    """`tokenizer_json` for llguidance: a decoder that is the GGUF converter's no-op steps then
    ByteLevel becomes that ByteLevel alone (what the model's original tokenizer.json has); any
    other decoder is left as it is. `check_token_bytes` still compares the result with the
    tokenizer's real decoding."""
    spec = json.loads(tokenizer_json)
    decoder = spec.get("decoder") or {}
    steps = decoder.get("decoders") if decoder.get("type") == "Sequence" else None
    if not steps or steps[-1].get("type") != "ByteLevel":
        return tokenizer_json
    if any(step not in GGUF_NO_OP_STEPS for step in steps[:-1]):
        return tokenizer_json
    spec["decoder"] = steps[-1]
    return json.dumps(spec)
