"""`GrammarMatcher`: one request's position in its grammar, and `BitmaskFiller`: a step's masks.

A matcher is advanced by exactly the tokens appended to the request's output (accept), moved back
by tokens taken away again (rollback: unaccepted draft tokens of a multi-token step), and asked
for the token mask of the next position. Its state depends on the generated tokens only, so
preemption, recompute and prefix-cache hits leave it alone.

Token masks are int32 bitmasks [rows, ceil(V / 32)] in numpy (bit j of word w allows token
32 * w + j): the engine fills them without torch, the sampler applies them (`bitmask.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import numpy as np

from pytgi.grammar.definition import one_line

# what llguidance puts where its verbose errors would give the parser state (pytgi turns them off)
NON_VERBOSE_MARK = "<non-verbose/>"


class GrammarMatcher:
    """Wraps an llguidance matcher. llguidance never raises on grammar or token errors: the
    matcher enters an error state (`error`), which the engine turns into a failed request."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: llguidance.LLMatcher):
        self._matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        """Advance by one sampled token; False (and `error` set) if the grammar forbids it."""
        return self._matcher.consume_token(token_id)

    def accept_tokens(self, token_ids: Sequence[int]) -> int:
        """Advance by the longest allowed prefix of `token_ids`; returns its length."""
        return self._matcher.try_consume_tokens(list(token_ids))

    def count_valid(self, token_ids: Sequence[int]) -> int:
        """How many leading `token_ids` (e.g. draft tokens) the grammar allows; no state change."""
        return self._matcher.validate_tokens(list(token_ids))

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens."""
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self.error}")

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete and nothing but EOS may follow (or EOS was accepted)."""
        return self._matcher.is_stopped()

    @property
    def is_accepting(self) -> bool:
        """What was accepted so far is a complete match (EOS is allowed next)."""
        return self._matcher.is_accepting()

    @property
    def error(self) -> str | None:
        """Why the matcher failed, for the user (one line, no parser dump), or None."""
        if not self._matcher.is_error():
            return None
        message = self._matcher.get_error().replace(NON_VERBOSE_MARK, "")
        return one_line(message) or "the grammar matcher failed"

    def fill_bitmask(self, bitmask: np.ndarray, row: int = 0) -> None:
        """Write the allowed next tokens into `bitmask[row]` (int32 [rows, W], C-contiguous)."""
        _check_bitmask(bitmask, row)
        target = bitmask[row]
        self._matcher.unsafe_compute_mask_ptr(target.ctypes.data, target.nbytes)

    def fast_forward_tokens(self) -> list[int]:
        """Tokens the grammar forces next (jump-forward decoding could append them unsampled)."""
        return self._matcher.compute_ff_tokens()

    @property
    def llguidance_matcher(self) -> llguidance.LLMatcher:
        return self._matcher


class BitmaskFiller:
    """Fills the token masks of a step's constrained rows in parallel (llguidance's thread pool
    computes them without the GIL)."""

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int], num_threads: int = 1):
        self.vocab_size = vocab_size
        self.width = (vocab_size + 31) // 32
        self._executor = llguidance.LLExecutor(num_threads=num_threads)
        self._eos_only = np.zeros(self.width, dtype=np.int32)
        for token_id in eos_token_ids:
            self._eos_only.view(np.uint32)[token_id // 32] |= np.uint32(1 << (token_id % 32))

    def allocate(self, num_rows: int) -> np.ndarray:
        """An all-allowed bitmask [num_rows, W]."""
        return np.full((num_rows, self.width), -1, dtype=np.int32)

    def fill(self, rows: Sequence[tuple[GrammarMatcher, int]], bitmask: np.ndarray) -> list[int]:
        """Fill `bitmask[row]` for every (matcher, row); returns the rows whose matcher failed.

        A failed row (a lexer limit reached while computing the mask) gets an EOS-only mask, so
        the step samples finite logits; its request must then end with the matcher's error.
        """
        if not rows:
            return []
        for _, row in rows:
            _check_bitmask(bitmask, row)
        if bitmask.shape[1] != self.width:
            raise ValueError(f"bitmask width {bitmask.shape[1]} != {self.width}")
        pairs = [(m.llguidance_matcher, row) for m, row in rows]
        self._executor.unsafe_compute_mask_ptr(
            pairs, bitmask.ctypes.data, self.width * 4, bitmask.shape[0]
        )
        return self._mark_failed(list(rows), bitmask)

    def fill_with_drafts(
        self, rows: Sequence[tuple[GrammarMatcher, int, Sequence[int]]], bitmask: np.ndarray
    ) -> list[int]:
        """Masks for a multi-token step: for (matcher, row, drafts), `bitmask[row + j]` is the mask
        after the first j drafts (j = 0 .. len(drafts)), one row per verification position; rows
        without drafts are plain rows. The matchers end where they started; drafts should be cut
        at `count_valid` first (a row past an invalid draft is left untouched). Returns the first
        rows of the failed matchers."""
        if not rows:
            return []
        for _, row, drafts in rows:
            _check_bitmask(bitmask, row + len(drafts))
        if bitmask.shape[1] != self.width:
            raise ValueError(f"bitmask width {bitmask.shape[1]} != {self.width}")
        triples = [(m.llguidance_matcher, row, list(d)) for m, row, d in rows if d]
        plain = [(m.llguidance_matcher, row) for m, row, d in rows if not d]
        if triples:  # llguidance's draft call refuses empty drafts
            self._executor.unsafe_compute_mask_ptr_with_draft_token(
                triples, bitmask.ctypes.data, self.width * 4, bitmask.shape[0]
            )
        if plain:
            self._executor.unsafe_compute_mask_ptr(
                plain, bitmask.ctypes.data, self.width * 4, bitmask.shape[0]
            )
        return self._mark_failed([(m, row) for m, row, _ in rows], bitmask)

    def _mark_failed(
        self, rows: list[tuple[GrammarMatcher, int]], bitmask: np.ndarray
    ) -> list[int]:
        failed = [row for m, row in rows if m.error is not None]
        for row in failed:
            bitmask[row] = self._eos_only
        return failed


def _check_bitmask(bitmask: np.ndarray, row: int) -> None:
    if bitmask.dtype != np.int32 or bitmask.ndim != 2 or not bitmask.flags.c_contiguous:
        raise ValueError("a token bitmask is a C-contiguous int32 array [rows, words]")
    if not 0 <= row < bitmask.shape[0]:
        raise IndexError(f"row {row} outside a bitmask of {bitmask.shape[0]} rows")
