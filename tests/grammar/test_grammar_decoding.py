"""Decoding driven only by the token mask, on real tokenizers, always yields valid output: JSON
that parses and validates against its schema (jsonschema, formats checked), regexes that match
in full. Greedy and sampled, over random logits (what a random-weight model produces)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from grammar_test_cases import REGEXES, SCHEMAS

from pytgi.messages.sampling_params import GrammarSpec

SEEDS = (0, 1, 2)


def validate(schema: dict, text: str) -> None:
    value = json.loads(text)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    jsonschema.Draft202012Validator(schema, format_checker=checker).validate(value)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_validate(compiler, mask_decoder, name, sample):
    schema = SCHEMAS[name]
    compiled = compiler.compile(GrammarSpec.json_schema(schema))
    for seed in SEEDS:
        text, _ = mask_decoder.run(compiled, seed=seed, sample=sample)
        validate(schema, text)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", sorted(REGEXES))
def test_regex_outputs_match_in_full(compiler, mask_decoder, name, sample):
    pattern = REGEXES[name]
    compiled = compiler.compile(GrammarSpec.regex(pattern))
    for seed in SEEDS:
        text, _ = mask_decoder.run(compiled, seed=seed, sample=sample)
        assert re.fullmatch(pattern, text, flags=re.ASCII), text


def test_json_is_written_like_json_dumps(compiler, mask_decoder):
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "integer"}},
            "b": {
                "type": "object",
                "patternProperties": {"^[a-z]{1,6}$": {"type": "boolean"}},
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
    }
    compiled = compiler.compile(GrammarSpec.json_schema(schema))
    for seed in SEEDS:
        text, _ = mask_decoder.run(compiled, seed=seed, sample=True)
        assert text == json.dumps(json.loads(text), ensure_ascii=False)


def test_tool_call_names_an_offered_tool(compiler, mask_decoder):
    compiled = compiler.compile(GrammarSpec.json_schema(SCHEMAS["tools_auto"]))
    names = set()
    for seed in range(8):
        text, _ = mask_decoder.run(compiled, seed=seed, sample=True)
        call = json.loads(text)["function"]
        names.add(call["_name"])
    assert names <= {"get_current_weather", "ship", "get_time", "no_tool"}
    assert len(names) > 1  # the choice is the model's, not forced to the first tool


def test_the_grammar_end_allows_only_eos(compiler, vocab):
    compiled = compiler.compile(GrammarSpec.regex("(yes|no)"))
    matcher = compiled.matcher()
    for token_id in vocab.tokenizer.tokenize_str("yes"):
        assert matcher.accept_token(token_id)
    assert matcher.is_stopped and matcher.is_accepting
    import numpy as np

    from pytgi.grammar import BitmaskFiller

    bitmask = BitmaskFiller(vocab.vocab_size, vocab.eos_token_ids).allocate(1)
    matcher.fill_bitmask(bitmask)
    allowed = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little"))
    assert allowed.tolist() == sorted(vocab.eos_token_ids)
