"""The engine's side of constrained decoding (grammar, response_format, tools).

- A request with `SamplingParams.grammar` is parked while its grammar compiles on the compiler's
  thread pool (`submit`, `poll`): the step loop never waits for a compile, and a request that
  cannot run yet never sits at the head of the queue.
- Each step, `fill_masks` gives every sampled row of a grammar request (one per draft position
  too) its token mask in `ScheduledRequest.grammar_bitmask`, which only rank 0's sampler reads.
  The masks are filled on a thread while the forward runs (llguidance computes them without the
  GIL); the step's `MaskFill` goes to the executor beside the step, and rank 0 waits for it
  before it samples. No matcher is touched until then.
- The scheduler advances each request's matcher by the tokens it appends (`Scheduler._append`).

Built once per engine, after the model is loaded (the masks cover the model's logits width): the
tokenizer's vocabulary reaches the grammar engine once. llguidance is imported only here and only
then, so importing pytgi.engine loads neither llguidance nor torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import TYPE_CHECKING

from pytgi.config import EngineConfig, GrammarConfig
from pytgi.engine.request import Request
from pytgi.messages.outputs import SchedulerOutput

if TYPE_CHECKING:
    from pytgi.grammar import GrammarVocab

logger = logging.getLogger(__name__)


class GrammarManager:
    def __init__(self, vocab: GrammarVocab, config: GrammarConfig):
        from pytgi.grammar import BitmaskFiller, GrammarCompiler

        self.vocab = vocab
        self.compiler = GrammarCompiler(vocab, config)
        self.filler = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids, config.mask_threads)
        self._fill_thread = ThreadPoolExecutor(1, thread_name_prefix="pytgi-masks")

    @classmethod
    def from_config(
        cls, config: EngineConfig, vocab_size: int, model_dir: Callable[[], Path]
    ) -> GrammarManager | None:
        """The manager for this engine's tokenizer (in `model_dir()`, the model's local
        directory), or None when grammars are off or the grammar engine cannot read the tokenizer
        (then the engine does not report the capability)."""
        if config.grammar is None:
            return None
        try:
            vocab = load_vocab(config, vocab_size, model_dir())
        except Exception as exc:  # e.g. a tokenizer without EOS, a vocabulary wider than the model
            logger.warning("constrained decoding is off: the grammar engine cannot use the "
                           "tokenizer (%s: %s)", type(exc).__name__, exc)  # fmt: skip
            return None
        logger.info("constrained decoding on: llguidance, %d tokens", vocab.vocab_size)
        return cls(vocab, config.grammar)

    def submit(self, request: Request) -> None:
        """Start compiling the request's grammar (cached by spec: an equal grammar joins it)."""
        request.pending_grammar = self.compiler.submit(request.sampling.grammar)

    def poll(self, parked: list[Request]) -> tuple[list[Request], list[tuple[Request, str]]]:
        """The parked requests whose grammar has compiled (now holding their own matcher), and
        those whose grammar failed or ran past the compile timeout (with the reason)."""
        from pytgi.grammar import GrammarError

        ready, failed = [], []
        for request in parked:
            try:
                compiled = request.pending_grammar.poll()
            except GrammarError as exc:
                failed.append((request, str(exc)))
                continue
            if compiled is not None:
                request.grammar = compiled.matcher()
                request.pending_grammar = None
                ready.append(request)
        return ready, failed

    @staticmethod
    def wait(parked: list[Request], timeout_s: float) -> None:
        """Sleep until one of the parked requests' compiles ends, at most `timeout_s`."""
        futures = [r.pending_grammar.future for r in parked if r.pending_grammar is not None]
        if futures:
            wait_futures(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def fill_masks(self, output: SchedulerOutput, requests: dict[str, Request]) -> MaskFill | None:
        """Give every sampled request with a grammar its rows of the step's token masks, filled
        on the mask thread while the step runs; None when the step has no such rows.

        The rows of all such requests are filled in one batched call (llguidance's thread pool,
        without the GIL). A matcher that fails while computing its mask (a lexer limit reached)
        gets an EOS-only row; the scheduler then finishes its request with the matcher's error.
        No matcher may be touched elsewhere until the fill is joined.
        """
        targets, rows, num_rows = [], [], 0
        for scheduled in output.requests:
            request = requests[scheduled.request_id]
            if not scheduled.sample or request.grammar is None:
                continue
            targets.append((scheduled, num_rows))
            rows.append((request.grammar, num_rows, scheduled.draft_ids))
            num_rows += 1 + len(scheduled.draft_ids)
        if not rows:
            return None
        bitmask = self.filler.allocate(num_rows)  # int32 [rows, ceil(V / 32)]
        for scheduled, first in targets:
            scheduled.grammar_bitmask = bitmask[first : first + 1 + len(scheduled.draft_ids)]
        return MaskFill(self._fill_thread.submit(self.filler.fill_with_drafts, rows, bitmask))

    def close(self) -> None:
        self._fill_thread.shutdown(wait=True)  # a fill in flight ends first
        self.compiler.close()


class MaskFill:
    """One step's token masks being filled (`PendingMasks`): made by `fill_masks`, waited for by
    rank 0 before sampling (and by the scheduler before it fails a step that raised)."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self) -> None:
        self._future.result()

    @property
    def done(self) -> bool:
        return self._future.done()


def load_vocab(config: EngineConfig, vocab_size: int, model_dir: Path) -> GrammarVocab:
    """The grammar engine's vocabulary from the model's tokenizer, as wide as its logits."""
    from pytgi.grammar import GrammarVocab
    from pytgi.tokenizer.tokenizer import Tokenizer

    model = config.model
    tokenizer = Tokenizer.from_dir(model_dir, config_path=model.tokenizer_config_path)
    return GrammarVocab.from_tokenizer(tokenizer, vocab_size or None)
