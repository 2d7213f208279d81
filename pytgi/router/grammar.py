"""Grammar requests (`grammar`, `response_format`, tool grammars) checked and normalised
(TGI_COMPATIBILITY.md §13, §14).

`parse_grammar` turns a `GrammarParam` into a `GrammarSpec` (a JSON schema or a regex) or raises
`ValidationError` with TGI's texts: structural problems are "grammar is not valid: …", schemas the
grammar engine cannot compile "cannot compile regex from schema: …" (TGI's text for the same
class of failure). `compile_check` runs the grammar engine's own tokenizer-free check; both run
before admission, so a bad grammar is a 422, never an engine crash. What only fails against the
vocabulary fails in the engine's compile, before any token: `grammar_error` gives it the same
texts.

TGI (outlines) reads a schema node with `properties` and no `type` as an object; JSON Schema reads
it as "any value". pytgi follows TGI: such nodes get `"type": "object"` before compiling.
"""

from __future__ import annotations

import asyncio
import json
import re
from functools import lru_cache
from typing import Any

from pytgi.config import GrammarConfig
from pytgi.errors import ValidationError
from pytgi.messages.sampling_params import GrammarSpec
from pytgi.router.errors import input_error
from pytgi.router.params import GrammarParam

NOT_SUPPORTED = "grammar is not supported"
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# `{"type": "json_object"}` with no schema: any JSON object (OpenAI's JSON mode)
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def parse_grammar(grammar: GrammarParam) -> GrammarSpec:
    if grammar.type == "regex":
        return GrammarSpec.regex(_check_regex(grammar.value))
    if grammar.type == "json_schema":
        schema, strict = _json_schema_wrapper(grammar.value)
        return GrammarSpec.json_schema(as_tgi_schema(_check_schema(schema)), strict=strict)
    if grammar.type == "json_object" and grammar.value is None:
        return GrammarSpec.json_schema(ANY_OBJECT_SCHEMA)
    return GrammarSpec.json_schema(as_tgi_schema(_check_schema(_schema_value(grammar.value))))


async def compile_check(spec: GrammarSpec, config: GrammarConfig) -> None:
    """The grammar engine's check (~1 ms, off the event loop, bounded by `compile_timeout_s`)."""
    try:
        problem = await asyncio.wait_for(
            asyncio.to_thread(_compile_problem, spec, config), config.compile_timeout_s
        )
    except asyncio.TimeoutError:  # noqa: UP041 - not the builtin before Python 3.11
        problem = f"compiling the grammar took more than {config.compile_timeout_s:g} s"
    if problem is not None:
        raise grammar_error(spec, problem)


def grammar_error(spec: GrammarSpec, problem: str) -> ValidationError:
    """422 for a grammar the grammar engine cannot compile, in TGI's words."""
    if spec.kind == "json":
        return input_error(f"cannot compile regex from schema: {problem}")
    return input_error(f"grammar is not valid: {problem}")


@lru_cache(maxsize=256)
def _compile_problem(spec: GrammarSpec, config: GrammarConfig) -> str | None:
    from pytgi.grammar import GrammarError, check_grammar  # llguidance: loaded on first use

    try:
        check_grammar(spec, config)
    except GrammarError as exc:
        return str(exc)
    return None


def as_tgi_schema(node: Any) -> Any:
    """A copy of `node` where every schema with `properties` and no `type` is an object."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("properties"), dict) and "type" not in out:
        out["type"] = "object"
    for key, value in out.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: as_tgi_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [as_tgi_schema(sub) for sub in value]
        elif key in _SCHEMA_VALUES:
            out[key] = as_tgi_schema(value)
    return out


_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "$functions", "dependentSchemas"}
)
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems", "items"})
_SCHEMA_VALUES = frozenset(
    {"items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames"}
)


def _schema_value(value: Any) -> dict[str, Any]:
    """TGI's `json` value: a schema object, or a string holding one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise input_error(f"grammar is not valid: {exc}") from exc
        if not isinstance(value, dict):
            raise input_error("grammar is not valid: the schema must be a JSON object")
        return value
    if isinstance(value, dict):
        return value
    raise input_error(NOT_SUPPORTED)


def _json_schema_wrapper(value: Any) -> tuple[dict[str, Any], bool]:
    """`json_schema` value: `{"name"?, "strict"?, "schema": {...}}` → (schema, strict).

    Only an explicit `strict: false` relaxes enforcement (keywords the engine cannot enforce are
    ignored instead of refused); TGI ignores `strict`, OpenAI defaults it to false but then does
    not constrain at all.
    """
    if not isinstance(value, dict) or "schema" not in value:
        raise input_error("grammar is not valid: `json_schema` needs a `schema` object")
    return _schema_value(value["schema"]), value.get("strict") is not False


def _check_schema(schema: dict[str, Any]) -> dict[str, Any]:
    if "properties" not in schema:
        raise input_error("grammar is not valid: Grammar must have a 'properties' field")
    problem = schema_problem(schema)
    if problem:
        raise input_error(f"grammar is not valid: {problem}")
    return schema


def schema_problem(node: Any, path: str = "#") -> str | None:
    """The first structural error in a JSON schema (types, properties, items, required), if any."""
    if isinstance(node, bool):
        return None
    if not isinstance(node, dict):
        return f"{path} must be an object or a boolean"
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in JSON_TYPES:
            return f"{path}/type: {json.dumps(k)} is not a valid JSON type"
    props = node.get("properties", {})
    if not isinstance(props, dict):
        return f"{path}/properties must be an object"
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{path}/required must be a list of strings"
    children = [(f"{path}/properties/{k}", v) for k, v in props.items()]
    children += _subschemas(node, path)
    for child_path, child in children:
        problem = schema_problem(child, child_path)
        if problem:
            return problem
    return None


def _subschemas(node: dict[str, Any], path: str) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for key in ("items", "additionalProperties", "not"):
        if key in node and not (key == "items" and isinstance(node[key], list)):
            found.append((f"{path}/{key}", node[key]))
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        options = node.get(key, [])
        if not isinstance(options, list):
            return [(f"{path}/{key}", None)]
        found += [(f"{path}/{key}/{i}", s) for i, s in enumerate(options)]
    for key in ("$defs", "definitions", "$functions"):
        for name, s in (node.get(key) or {}).items():
            found.append((f"{path}/{key}/{name}", s))
    return found


def _check_regex(value: Any) -> str:
    if not isinstance(value, str):
        raise input_error(NOT_SUPPORTED)
    try:
        re.compile(value)
    except re.error as exc:
        raise input_error(f"grammar is not valid: {exc}") from exc
    return value
