"""`StopSequenceMatcher`: finds user stop strings in text that arrives piece by piece
(TGI_COMPATIBILITY.md §13).

Text that could still be the start of a stop string is held back until that is decided, so a stop
string split over several tokens is found and released text never has to be taken back. On a match
the stop string itself stays in the output (TGI keeps it); `Infer` then aborts the engine request
and finishes with `stop_sequence`.

TGI looks for a stop string only at the very end of the text after each token; this matcher finds
it anywhere in the new text, a superset that also catches a stop followed by more text in the same
token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopMatch:
    """`text` ends right after the stop string; `trailing` followed it in the same piece."""

    stop: str
    text: str
    trailing: str


class StopSequenceMatcher:
    def __init__(self, stop_sequences: Sequence[str]):
        self.stop_sequences = tuple(s for s in stop_sequences if s)
        self._held = ""

    @property
    def held(self) -> str:
        return self._held

    def feed(self, text: str) -> tuple[str, StopMatch | None]:
        """Add text; return (released text, match). After a match, feed no more."""
        buffer = self._held + text
        match = self._earliest_match(buffer)
        if match is not None:
            self._held = ""
            return match.text, match
        keep = self._partial_suffix_length(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], None

    def flush(self) -> str:
        """Release held text (the sequence ended for another reason)."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, buffer: str) -> StopMatch | None:
        best: tuple[int, str] | None = None
        for stop in self.stop_sequences:
            pos = buffer.find(stop)
            if pos >= 0 and (best is None or pos + len(stop) < best[0] + len(best[1])):
                best = (pos, stop)
        if best is None:
            return None
        end = best[0] + len(best[1])
        return StopMatch(best[1], buffer[:end], buffer[end:])

    def _partial_suffix_length(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stop_sequences:
            window = min(len(stop) - 1, len(buffer))
            start = len(buffer) - window
            pos = buffer.find(stop[0], start)
            while pos >= 0 and len(buffer) - pos > longest:
                if stop.startswith(buffer[pos:]):
                    longest = len(buffer) - pos
                    break
                pos = buffer.find(stop[0], pos + 1)
        return longest
