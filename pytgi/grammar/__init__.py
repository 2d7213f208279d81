"""Constrained decoding (TGI `grammar`, OpenAI `response_format`, tool calls) with llguidance.

A leaf package, imported lazily by the engine; everything here is torch-free except `bitmask`
(the sampler's side). The pieces, in the order a request meets them:

- `definition.check_grammar(spec, config)`: the router's tokenizer-free check before admission.
- `GrammarVocab`: the vocabulary as llguidance sees it, built once per engine.
- `GrammarCompiler.submit(spec) → PendingGrammar`: asynchronous, cached, bounded compilation.
- `CompiledGrammar.matcher() → GrammarMatcher`: a request's own state (accept, rollback, mask).
- `BitmaskFiller.fill(rows, bitmask)`: a step's token masks, in parallel.
- `bitmask.apply_token_bitmask_(scores, bitmask, rows)`: the sampler's batched apply.

Why llguidance and not xgrammar: docs/PERFORMANCE.md, "Grammar engines".
"""

from pytgi.grammar.compiler import CompiledGrammar, GrammarCompiler, PendingGrammar
from pytgi.grammar.definition import GrammarError, check_grammar, grammar_definition
from pytgi.grammar.matcher import BitmaskFiller, GrammarMatcher
from pytgi.grammar.vocab import GrammarVocab

__all__ = [
    "BitmaskFiller",
    "CompiledGrammar",
    "GrammarCompiler",
    "GrammarError",
    "GrammarMatcher",
    "GrammarVocab",
    "PendingGrammar",
    "check_grammar",
    "grammar_definition",
]
