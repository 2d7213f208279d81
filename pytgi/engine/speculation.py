"""N-gram (prompt-lookup) speculation: draft tokens by finding the request's latest n tokens
earlier in its own history and proposing what followed them there (TGI's `--speculate` without a
draft model). Pure Python, no model: cheap, and its value depends on the text repeating itself
(code, extraction, summaries quoting the prompt).

Each request keeps an index from every n-gram of its history to the latest position after it,
extended as tokens arrive, so a proposal costs O(n) whatever the context length.
"""

from __future__ import annotations

from pytgi.engine.request import Request


class NgramIndex:
    """n-gram (as a tuple) -> the position right after its latest earlier occurrence."""

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.next_pos: dict[tuple[int, ...], int] = {}
        self.num_indexed = 1  # n-grams ending before this position are indexed

    def extend(self, request: Request) -> None:
        """Index the n-grams ending before each new position (the last token is never indexed:
        an n-gram needs a successor to propose). Reads only the new tokens and n before them."""
        first = max(0, self.num_indexed - self.max_ngram)
        window = request.token_ids(first, request.num_tokens)
        for end in range(self.num_indexed, request.num_tokens):
            for n in range(1, min(self.max_ngram, end) + 1):
                self.next_pos[tuple(window[end - n - first : end - first])] = end
        self.num_indexed = max(self.num_indexed, request.num_tokens)


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, max_ngram: int = 3):
        self.k = num_speculative_tokens
        self.max_ngram = max_ngram
        self.indexes: dict[str, NgramIndex] = {}

    def propose(self, request: Request, max_tokens: int) -> list[int]:
        """Up to min(k, max_tokens) draft tokens following the request's history."""
        count = min(self.k, max_tokens)
        num_tokens = request.num_tokens
        if count <= 0 or num_tokens < 2:
            return []
        index = self.indexes.setdefault(request.request_id, NgramIndex(self.max_ngram))
        index.extend(request)
        tail = request.token_ids(max(0, num_tokens - self.max_ngram), num_tokens)
        for n in range(min(self.max_ngram, num_tokens - 1), 0, -1):  # longest match first
            pos = index.next_pos.get(tuple(tail[-n:]))
            if pos is not None:
                return request.token_ids(pos, min(pos + count, num_tokens))
        return []

    def free(self, request_id: str) -> None:
        self.indexes.pop(request_id, None)
