"""GrammarMatcher (accept, rollback, draft checks), BitmaskFiller and the sampler-side apply."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pytgi.grammar import BitmaskFiller
from pytgi.grammar.bitmask import apply_token_bitmask_, banned_tokens
from pytgi.messages.sampling_params import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Joe", "n": 42}


def allowed(bitmask: np.ndarray, row: int, vocab_size: int) -> list[int]:
    bits = np.unpackbits(bitmask[row].view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits).tolist()


def instance_tokens(vocab) -> list[int]:
    return vocab.tokenizer.tokenize_str(json.dumps(INSTANCE))


@pytest.fixture
def compiled(compiler):
    return compiler.compile(GrammarSpec.json_schema(SCHEMA))


def test_accepts_a_valid_instance_then_only_eos(compiled, vocab):
    matcher = compiled.matcher()
    for token_id in instance_tokens(vocab):
        assert matcher.accept_token(token_id)
    assert matcher.is_accepting and matcher.is_stopped
    assert matcher.accept_token(vocab.eos_token_ids[0])


def test_a_forbidden_token_sets_the_error(compiled, vocab):
    matcher = compiled.matcher()
    (token_id,) = vocab.tokenizer.tokenize_str("x")
    assert not matcher.accept_token(token_id)
    assert matcher.error


def test_rollback_restores_the_mask(compiled, vocab):
    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)
    matcher, tokens = compiled.matcher(), instance_tokens(vocab)
    masks = []
    for token_id in tokens:
        bitmask = filler.allocate(1)
        matcher.fill_bitmask(bitmask)
        masks.append(bitmask.copy())
        assert matcher.accept_token(token_id)
    for back in (1, 3, len(tokens) - 1):
        matcher.rollback(back)
        bitmask = filler.allocate(1)
        matcher.fill_bitmask(bitmask)
        np.testing.assert_array_equal(bitmask, masks[len(tokens) - back])
        assert matcher.accept_tokens(tokens[len(tokens) - back :]) == back
    assert matcher.is_stopped and matcher.error is None


def test_draft_tokens_are_counted_and_accepted_up_to_the_first_invalid(compiled, vocab):
    tokens = instance_tokens(vocab)
    (bad,) = vocab.tokenizer.tokenize_str("x")
    draft = tokens[:4] + [bad] + tokens[5:]
    matcher = compiled.matcher()
    assert matcher.count_valid(draft) == 4
    assert matcher.accept_tokens(draft) == 4
    assert matcher.error is None  # a rejected draft token does not break the matcher
    assert matcher.accept_tokens(tokens[4:]) == len(tokens) - 4 and matcher.is_stopped


def test_fast_forward_tokens_are_what_the_grammar_forces(compiled, vocab):
    forced = compiled.matcher().fast_forward_tokens()
    assert vocab.decode(forced) and '{"name": "'.startswith(vocab.decode(forced))


def test_batched_fill_matches_per_row_fill(compiler, vocab):
    specs = [GrammarSpec.json_schema(SCHEMA), GrammarSpec.regex(r"\d{3}"), GrammarSpec.regex("a|b")]
    matchers = [compiler.compile(spec).matcher() for spec in specs]
    assert matchers[0].accept_tokens(instance_tokens(vocab)[:3]) == 3
    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids, num_threads=2)
    batch = filler.allocate(5)
    assert filler.fill([(m, row) for m, row in zip(matchers, (4, 0, 2), strict=True)], batch) == []
    for matcher, row in zip(matchers, (4, 0, 2), strict=True):
        single = filler.allocate(1)
        matcher.fill_bitmask(single)
        np.testing.assert_array_equal(batch[row], single[0])
    assert (batch[[1, 3]] == -1).all()  # rows without a grammar stay all-allowed


def test_draft_masks_follow_the_drafts_and_leave_the_matcher_in_place(compiled, vocab):
    tokens = instance_tokens(vocab)
    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)
    matcher, drafts = compiled.matcher(), tokens[2:6]
    assert matcher.accept_tokens(tokens[:2]) == 2
    batch = filler.allocate(1 + 1 + len(drafts))  # an unconstrained row 0, then this request
    assert filler.fill_with_drafts([(matcher, 1, drafts)], batch) == []
    assert (batch[0] == -1).all()
    reference = compiled.matcher()
    assert reference.accept_tokens(tokens[:2]) == 2
    for j in range(len(drafts) + 1):
        single = filler.allocate(1)
        reference.fill_bitmask(single)
        np.testing.assert_array_equal(batch[1 + j], single[0])
        if j < len(drafts):
            assert reference.accept_token(drafts[j])
    assert matcher.accept_tokens(tokens[2:]) == len(tokens) - 2  # it had not moved


def test_a_matcher_failing_in_a_step_reports_it(compiler, vocab):
    """The lexer runs out of states long before a million a's: the failure shows either when the
    step's mask is filled (the row then allows EOS only, so sampling stays finite) or when the
    token is accepted; both leave `error` set for the engine to end the request with."""
    matcher = compiler.compile(GrammarSpec.regex("a{1000000}")).matcher()
    filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)
    bitmask = filler.allocate(1)
    (a,) = vocab.tokenizer.tokenize_str("a")
    for _ in range(64):
        if filler.fill([(matcher, 0)], bitmask):
            assert allowed(bitmask, 0, vocab.vocab_size) == sorted(vocab.eos_token_ids)
            break
        if not matcher.accept_token(a):
            break
    assert matcher.error


def test_apply_bans_exactly_the_masked_tokens_of_the_listed_rows():
    vocab_size, rng = 100, np.random.default_rng(0)
    bitmask = rng.integers(-(2**31), 2**31 - 1, size=(2, 4), dtype=np.int32)  # covers 128 ids
    scores = torch.randn(3, vocab_size)
    expected = scores.clone()
    for i, row in enumerate((2, 0)):
        for token_id in range(vocab_size):
            if not (int(bitmask[i, token_id // 32]) >> (token_id % 32)) & 1:
                expected[row, token_id] = float("-inf")
    apply_token_bitmask_(scores, bitmask, rows=[2, 0])
    torch.testing.assert_close(scores, expected)


def test_tokens_past_the_bitmask_are_banned():
    bitmask = np.full((1, 1), -1, dtype=np.int32)  # covers ids 0..31
    banned = banned_tokens(bitmask, 40)
    assert banned.shape == (1, 40) and banned.dtype == torch.bool
    assert not banned[0, :32].any() and banned[0, 32:].all()
