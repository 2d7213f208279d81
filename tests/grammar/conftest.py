"""Real vocabularies for the grammar tests: the tiny models' BPE (384 tokens) and the demo model's
(4096 tokens), each with one shared compiler; and a decoder driven only by the token mask."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytgi.config import GrammarConfig
from pytgi.grammar import BitmaskFiller, CompiledGrammar, GrammarCompiler, GrammarVocab
from pytgi.grammar.bitmask import apply_token_bitmask_


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    from fixtures.tiny_models import build_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session", params=["tiny", "demo"])
def vocab(request, tiny_tokenizer_dir, demo_model_dir) -> GrammarVocab:
    model_dir = tiny_tokenizer_dir if request.param == "tiny" else demo_model_dir
    return GrammarVocab.from_model_dir(model_dir)


@pytest.fixture(scope="session")
def compiler(vocab) -> GrammarCompiler:
    compiler = GrammarCompiler(vocab, GrammarConfig(compile_threads=2))
    yield compiler
    compiler.close()


@pytest.fixture(scope="session")
def demo_vocab(demo_model_dir) -> GrammarVocab:
    return GrammarVocab.from_model_dir(demo_model_dir)


class MaskDecoder:
    """Decodes with random logits (a random-weight model) under the grammar's token masks only:
    each step fills the mask, applies it to the logits (`apply_token_bitmask_`) and picks greedily
    or samples; it stops at an EOS token."""

    def __init__(self, vocab: GrammarVocab):
        self.vocab = vocab
        self.filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids)

    def run(
        self, compiled: CompiledGrammar, *, seed: int, sample: bool, max_steps: int = 3000
    ) -> tuple[str, list[int]]:
        generator = torch.Generator().manual_seed(seed)
        matcher = compiled.matcher()
        bitmask = self.filler.allocate(1)
        tokens: list[int] = []
        for _ in range(max_steps):
            assert self.filler.fill([(matcher, 0)], bitmask) == [], matcher.error
            logits = torch.randn(1, self.vocab.vocab_size, generator=generator) * 4  # [1, V]
            apply_token_bitmask_(logits, bitmask)
            if sample:
                token = int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
            else:
                token = int(logits.argmax())
            assert matcher.accept_token(token), matcher.error
            if token in self.vocab.eos_token_ids:
                assert matcher.is_stopped
                return self.vocab.decode(tokens), tokens
            tokens.append(token)
        raise AssertionError(f"no EOS after {max_steps} steps: {self.vocab.decode(tokens)[:200]!r}")


@pytest.fixture(scope="session")
def mask_decoder(vocab) -> MaskDecoder:
    return MaskDecoder(vocab)
