"""Bidirectional spans: runs of prompt positions whose tokens attend to each other both ways
(the rest attends causally). A model declares a mode (`MultimodalLM.bidirectional`), and the
spans of a request follow from it and the request's prompt, as plain data:

- `PROMPT` (PaliGemma's prefix-LM): the whole prompt is one span;
- `IMAGES` (Gemma 3): each image's run of placeholder tokens is a span.

Invariant the engine keeps: a step's row of a request never starts or ends strictly inside a
span (the scheduler schedules a span whole; a prefix hit never ends inside one), so every span a
row touches lies wholly in its queries and its mask is causal | same-span.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytgi.messages.request import MultimodalInput

PROMPT = "prompt"
IMAGES = "images"
MODES = (PROMPT, IMAGES)

Span = tuple[int, int]  # [start, end) positions


def spans_of(
    mode: str | None, num_prompt_tokens: int, images: Sequence[MultimodalInput]
) -> tuple[Span, ...]:
    if mode == PROMPT:
        return ((0, num_prompt_tokens),)
    if mode == IMAGES:
        return tuple(sorted((i.offset, i.end) for i in images))
    return ()


def span_around(spans: Sequence[Span], position: int) -> Span | None:
    """The span that `position` cuts (start < position < end), if any."""
    for start, end in spans:
        if start < position < end:
            return start, end
    return None


def spans_in(spans: Sequence[Span], start: int, end: int) -> tuple[Span, ...]:
    """The spans of [start, end); each lies wholly inside (the invariant above)."""
    inside = tuple(s for s in spans if s[0] < end and s[1] > start)
    assert all(start <= s and e <= end for s, e in inside), "a row cuts a bidirectional span"
    return inside
