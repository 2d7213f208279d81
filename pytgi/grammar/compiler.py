"""`GrammarCompiler`: GrammarSpec → CompiledGrammar off the step loop, cached by spec, bounded.

Compiles run on a small thread pool (llguidance releases the GIL while it builds a grammar or a
mask); a request holds a `PendingGrammar` and the scheduler polls it between steps, so one slow
grammar delays only its own request. The work of a compile is bounded by llguidance's fuel limits
(`GrammarConfig`); the wait is bounded by `compile_timeout_s` from submission, queueing included.
Results, failures included, are cached by spec (LRU): the same schema compiles once. The cache is
bounded by count (`cache_size`) and by estimated bytes (`cache_bytes`): llguidance does not report
a compiled grammar's memory, so each entry counts `estimated_bytes(spec)`, a fit that stays above
what compiled JSON schemas of 2-100 KB were measured to hold (resident memory per cached grammar:
~0.5 MB for 2.6 KB of schema, ~4 MB for 100 KB, on a 49k-token vocabulary up to ~75 bytes per
character of schema).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import llguidance
import numpy as np

from pytgi.config import GrammarConfig
from pytgi.grammar.definition import GrammarError, grammar_definition, parser_limits
from pytgi.grammar.matcher import NON_VERBOSE_MARK, GrammarMatcher
from pytgi.grammar.vocab import GrammarVocab

if TYPE_CHECKING:  # the spec type lives with the engine's parameters
    from pytgi.messages.sampling_params import GrammarSpec

UNSATISFIABLE = "no output can satisfy the grammar"
BASE_BYTES = 1 << 20  # per compiled grammar: matcher, lexer start states, the first mask
BYTES_PER_CHAR = 80  # of the schema / regex text


def estimated_bytes(spec: GrammarSpec) -> int:
    """What a compiled `spec` is counted as in the cache's byte bound."""
    return BASE_BYTES + BYTES_PER_CHAR * len(spec.value)


class CompiledGrammar:
    """A grammar compiled against the vocabulary; each request gets its own `matcher()`."""

    def __init__(self, spec: GrammarSpec, template: llguidance.LLMatcher, compile_s: float):
        self.spec = spec
        self.compile_s = compile_s
        self._template = template  # never advanced: copied per request

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy())


class PendingGrammar:
    """A request's grammar while it compiles: `poll()` between steps, never blocks."""

    def __init__(self, future: Future[CompiledGrammar], deadline_s: float, timeout_s: float):
        self.future = future
        self.deadline_s = deadline_s  # time.monotonic()
        self.timeout_s = timeout_s

    def poll(self, now_s: float | None = None) -> CompiledGrammar | None:
        """The compiled grammar, None while compiling; GrammarError if it failed or timed out."""
        if self.future.done():
            return self.future.result()
        if (time.monotonic() if now_s is None else now_s) >= self.deadline_s:
            raise GrammarError(f"compiling the grammar took more than {self.timeout_s:g} s")
        return None

    def result(self) -> CompiledGrammar:
        """Wait (up to the deadline) for the compiled grammar; raises GrammarError."""
        try:
            return self.future.result(timeout=max(self.deadline_s - time.monotonic(), 0.0))
        except FutureTimeout:
            raise GrammarError(
                f"compiling the grammar took more than {self.timeout_s:g} s"
            ) from None


class GrammarCompiler:
    def __init__(self, vocab: GrammarVocab, config: GrammarConfig | None = None):
        self.vocab = vocab
        self.config = config or GrammarConfig()
        self._limits = parser_limits(self.config)
        self._pool = ThreadPoolExecutor(
            max_workers=self.config.compile_threads, thread_name_prefix="pytgi-grammar"
        )
        self._cache: OrderedDict[GrammarSpec, Future[CompiledGrammar]] = OrderedDict()
        self._cached_bytes = 0  # sum of estimated_bytes over the cache's specs
        self._lock = threading.Lock()

    def submit(self, spec: GrammarSpec) -> PendingGrammar:
        """Start compiling `spec` (or join the cached/in-flight compile of an equal spec)."""
        timeout_s = self.config.compile_timeout_s
        return PendingGrammar(self._future(spec), time.monotonic() + timeout_s, timeout_s)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile and wait (tests, tools); raises GrammarError."""
        return self.submit(spec).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def _future(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        with self._lock:
            future = self._cache.get(spec)
            if future is not None:
                self._cache.move_to_end(spec)
                return future
            future = self._pool.submit(self._compile, spec)
            self._cache[spec] = future
            self._cached_bytes += estimated_bytes(spec)
            while len(self._cache) > 1 and (
                len(self._cache) > self.config.cache_size
                or self._cached_bytes > self.config.cache_bytes
            ):  # the newest entry stays: its request holds it anyway
                evicted, _ = self._cache.popitem(last=False)
                self._cached_bytes -= estimated_bytes(evicted)
            return future

    def _compile(self, spec: GrammarSpec) -> CompiledGrammar:
        start = time.perf_counter()
        definition = grammar_definition(spec, self.config)
        matcher = llguidance.LLMatcher(
            self.vocab.tokenizer, definition, log_level=0, limits=self._limits
        )
        _raise_if_failed(matcher)
        # the first mask is computed here, off the step loop: it builds the lexer states of the
        # start, and finds what only shows against the vocabulary (lexer limits, unsatisfiable)
        first = np.zeros((1, self.vocab.bitmask_width), dtype=np.int32)
        GrammarMatcher(matcher).fill_bitmask(first, 0)
        _raise_if_failed(matcher)
        if not first.any():
            raise GrammarError(UNSATISFIABLE)
        return CompiledGrammar(spec, matcher, time.perf_counter() - start)


def _raise_if_failed(matcher: llguidance.LLMatcher) -> None:
    if not matcher.is_error():
        return
    message = matcher.get_error().replace(NON_VERBOSE_MARK, "")
    if message.startswith("NoExtension"):  # the parser ran out of ways to continue
        message = UNSATISFIABLE
    raise GrammarError(message)
