"""Prompt text: synthesised to an exact token count, or read from a prompts file.

A prompts file is either JSON Lines (`{"prompt": "...", "output_tokens": 64}` per line, the
output length optional; `text` is accepted for `prompt`, `max_new_tokens` for `output_tokens`) or
plain text with one prompt per line. Blank lines are skipped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from pytgi.benchmark.http.errors import BenchConfigError
from pytgi.benchmark.http.tokenizer import TextTokenizer

PROSE_WORDS = (
    "the a an of to in and or but with for on at by from as into over under between about "
    "server client model token request response stream latency throughput batch cache memory "
    "queue engine prompt answer question river mountain city village market garden library "
    "music painting story history science number letter window table chair morning evening "
    "quickly slowly carefully quietly brightly often never always sometimes today tomorrow "
    "walks reads writes builds measures explains remembers carries opens closes finds keeps "
    "green blue small large ancient modern simple careful bright quiet heavy light warm cold"
).split()
CODE_WORDS = (
    "def return if else elif for while in import from class self None True False lambda "
    "yield with as try except raise pass break continue and or not is ( ) [ ] { } : , . = == "
    "+ - * / % += -> value result items index count total name key data node parent child "
    "buffer offset length size config request response cache batch token stream print len "
    "range list dict set str int float append extend update get keys values 0 1 2 10 100"
).split()
MAX_ADJUSTMENTS = 8


@dataclass(frozen=True)
class FilePrompt:
    text: str
    num_tokens: int
    output_tokens: int | None = None


def synthesize_prompt(
    tokenizer: TextTokenizer, rng: random.Random, num_tokens: int, style: str = "prose"
) -> tuple[str, int]:
    """Random text of `num_tokens` tokens; returns (text, its token count).

    Decoding a slice of ids and encoding it again can merge or split tokens at the cut, so the
    slice is adjusted until the round trip gives the requested count (or the closest one seen).
    """
    token_ids = tokenizer.encode(_random_text(rng, num_tokens, style))
    while len(token_ids) < num_tokens + 2:
        token_ids += tokenizer.encode(" " + _random_text(rng, num_tokens, style))
    best = (tokenizer.decode(token_ids[:num_tokens]), -1)
    cut = num_tokens
    for _ in range(MAX_ADJUSTMENTS):
        text = tokenizer.decode(token_ids[:cut])
        count = tokenizer.count(text)
        if abs(count - num_tokens) < abs(best[1] - num_tokens):
            best = (text, count)
        if count == num_tokens:
            break
        cut = max(1, cut + num_tokens - count)
    return best


def _random_text(rng: random.Random, num_words: int, style: str) -> str:
    words = CODE_WORDS if style == "code" else PROSE_WORDS
    picked = rng.choices(words, k=num_words)
    if style == "code":
        return " ".join(w + ("\n" if rng.random() < 0.12 else "") for w in picked)
    return " ".join(w + ("." if rng.random() < 0.08 else "") for w in picked)


def read_prompts_file(path: Path, tokenizer: TextTokenizer) -> list[FilePrompt]:
    """Read and measure every prompt of a .jsonl or plain-text prompts file."""
    try:
        lines = [
            line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    except OSError as exc:
        raise BenchConfigError(f"cannot read prompts file '{path}': {exc}") from exc
    if not lines:
        raise BenchConfigError(f"prompts file '{path}' has no prompts")
    if str(path).endswith((".jsonl", ".json")):
        return [_json_prompt(path, n, line, tokenizer) for n, line in enumerate(lines, 1)]
    return [FilePrompt(line, tokenizer.count(line)) for line in lines]


def _json_prompt(path: Path, line_no: int, line: str, tokenizer: TextTokenizer) -> FilePrompt:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchConfigError(f"{path}:{line_no}: not JSON: {exc}") from exc
    text = item.get("prompt", item.get("text")) if isinstance(item, dict) else None
    if not isinstance(text, str) or not text:
        raise BenchConfigError(f"{path}:{line_no}: needs a non-empty 'prompt' string")
    output_tokens = item.get("output_tokens", item.get("max_new_tokens"))
    if output_tokens is not None and (not isinstance(output_tokens, int) or output_tokens < 1):
        raise BenchConfigError(f"{path}:{line_no}: 'output_tokens' must be a positive integer")
    return FilePrompt(text, tokenizer.count(text), output_tokens)
