"""`GrammarSpec` → llguidance grammar definition, with pytgi's JSON options and size limits.

Also the tokenizer-free check the router runs before admission (`check_grammar`): it catches
invalid or unsatisfiable schemas, keywords that cannot be enforced, regexes the engine cannot
parse and grammars over the size limits, in about a millisecond and without the vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import llguidance

from pytgi.config import GrammarConfig

if TYPE_CHECKING:  # the spec type lives with the engine's parameters
    from pytgi.messages.sampling_params import GrammarSpec

# JSON is written the way json.dumps writes it: `{"a": 1, "b": [2, 3]}`. A fixed layout keeps a
# weak model from emitting whitespace forever (free whitespace is an endless-loop trap) and costs
# fewer tokens. These override any `x-guidance` options a schema carries.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# TGI (outlines) reads \d, \w and \s as ASCII classes; so does pytgi, so that every output also
# matches under Python's `re` (whose Unicode classes contain the ASCII ones)
REGEX_ASCII_CLASSES = "dws"
MAX_MESSAGE_CHARS = 300


class GrammarError(ValueError):
    """A grammar that cannot be used; the message is for the user (one line, no parser dump)."""

    def __init__(self, message: str):
        super().__init__(one_line(message))


def one_line(message: str) -> str:
    text = " ".join(message.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def parser_limits(config: GrammarConfig) -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(
        max_grammar_size=config.max_grammar_size,
        max_lexer_states=config.max_lexer_states,
        initial_lexer_fuel=config.initial_lexer_fuel,
        step_lexer_fuel=config.step_lexer_fuel,
        verbose_errors=False,  # no parser state or grammar text in messages that reach users
    )


def grammar_definition(spec: GrammarSpec, config: GrammarConfig) -> str:
    """The llguidance grammar (its JSON form) for `spec`; raises GrammarError."""
    try:
        size = len(spec.value.encode("utf-8"))
    except UnicodeEncodeError:  # the HTTP routes refuse these bodies; the offline API may not
        raise GrammarError("the grammar holds a lone UTF-16 surrogate (not valid UTF-8)") from None
    if size > config.max_grammar_bytes:
        raise GrammarError(
            f"the grammar is {size} bytes long, more than the limit of {config.max_grammar_bytes}"
        )
    if spec.kind == "regex":
        pattern = llguidance.regex_to_lark(spec.value, REGEX_ASCII_CLASSES)
        return llguidance.LLMatcher.grammar_from_lark(f"start: /{pattern}/")
    options = {**JSON_OPTIONS, "lenient": not spec.strict}
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(spec.value, overrides=options)
    except ValueError as exc:  # not JSON, or nested deeper than the JSON parser allows
        raise GrammarError(str(exc)) from None


def check_grammar(spec: GrammarSpec, config: GrammarConfig) -> None:
    """Raise GrammarError if `spec` cannot compile (tokenizer-free; the engine compiles again
    against the vocabulary, which can still fail on lexer limits reached at the first mask)."""
    definition = grammar_definition(spec, config)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        definition, None, limits=parser_limits(config)
    )
    if is_error:
        raise GrammarError(messages[0] if messages else "the grammar does not compile")
