"""A minimal server-sent-events decoder: lines in, complete `data` payloads out.

Accepts `data:` with or without the space (TGI/axum send none, OpenAI servers send one), joins
multi-line data, and ignores comments (`:` keep-alives) and the `event`/`id`/`retry` fields.
"""

from __future__ import annotations


class SSEDecoder:
    def __init__(self) -> None:
        self._data_lines: list[str] = []

    def feed_line(self, line: str) -> str | None:
        """Feed one line (no newline); returns an event's data when a blank line ends it."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data_lines.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The pending event's data, if any (for a stream that ends without a blank line)."""
        if not self._data_lines:
            return None
        data = "\n".join(self._data_lines)
        self._data_lines = []
        return data
