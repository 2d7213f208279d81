"""Streaming tool calls: the text of a tool-mode generation → OpenAI `tool_calls` argument deltas.

The model writes `{"function": {"_name": "<name>", <arguments>}}` (the router's tool grammar,
TGI_COMPATIBILITY.md §14). As TGI does, nothing is emitted until the name is complete; the first
delta carries the name and
`"{"`, the following ones the argument text as it arrives, and the wrapper's closing brace is
dropped, so the concatenated `arguments` is the JSON object of the arguments.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

_NAME = re.compile(r'^\s*\{\s*"function"\s*:\s*\{\s*"_name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*(?=[,}]),?')
_CLOSING = re.compile(r"\}\s*$")


class ToolCallStreamer:
    """Feed generated text; get `(name, arguments_fragment)` pieces to emit."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._head = ""  # text before the name is known
        self._pending = ""  # argument text held back: it may end with the wrapper's brace

    def feed(self, text: str) -> list[tuple[str | None, str]]:
        if self.name is None:
            self._head += text
            match = _NAME.match(self._head)
            if match is None:
                return []
            self.name = match.group(1)
            self._pending = "{" + self._head[match.end() :].lstrip()
            released = self._release()
            return [(self.name, released[0][1] if released else "")]
        self._pending += text
        return self._release()

    def finish(self) -> list[tuple[str | None, str]]:
        """The rest of the arguments, without the wrapper's closing brace."""
        if self.name is None:
            return []
        rest = _CLOSING.sub("", self._pending, count=1)
        self._pending = ""
        return [(None, rest)] if rest else []

    def _release(self) -> list[tuple[str | None, str]]:
        cut = self._pending.rfind("}")
        if cut == -1 or self._pending[cut + 1 :].strip():
            cut = len(self._pending)
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return [(None, ready)] if ready else []


def stream_tool_call_id(messages: Sequence[Mapping[str, Any]]) -> str:
    """TGI: one more than the largest numeric tool-call id in the history, else a UUID."""
    ids = [
        int(call["id"])
        for message in messages
        for call in message.get("tool_calls") or ()
        if str(call.get("id", "")).isdigit()
    ]
    return str(max(ids) + 1) if ids else uuid.uuid4().hex
