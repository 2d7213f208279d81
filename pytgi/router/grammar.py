"""Grammar requests (`grammar`, `response_format`, tool grammars) checked and normalised (§2.4, §8).

`parse_grammar` turns a `GrammarParam` into a `GrammarSpec` (a JSON schema or a regex) or raises
`ValidationError` with TGI's texts. It runs before admission, so a bad schema or regex is a 422,
never an engine crash. Constrained decoding itself belongs to the engine's sampler.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from pytgi.router.errors import input_error
from pytgi.router.params import GrammarParam

NOT_SUPPORTED = "grammar is not supported"
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# `{"type": "json_object"}` with no schema: any JSON object (OpenAI's JSON mode)
ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class GrammarSpec:
    """A validated grammar: a JSON-schema dict (kind "json") or a regex string (kind "regex")."""

    kind: Literal["json", "regex"]
    value: dict[str, Any] | str


def parse_grammar(grammar: GrammarParam) -> GrammarSpec:
    if grammar.type == "regex":
        return GrammarSpec("regex", _check_regex(grammar.value))
    if grammar.type == "json_schema":
        return GrammarSpec("json", _check_schema(_json_schema_wrapper(grammar.value)))
    if grammar.type == "json_object" and grammar.value is None:
        return GrammarSpec("json", dict(ANY_OBJECT_SCHEMA))
    return GrammarSpec("json", _check_schema(_schema_value(grammar.value)))


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


def _json_schema_wrapper(value: Any) -> dict[str, Any]:
    """`json_schema` value: `{"name"?, "strict"?, "schema": {...}}` (`strict` is ignored)."""
    if not isinstance(value, dict) or "schema" not in value:
        raise input_error("grammar is not valid: `json_schema` needs a `schema` object")
    return _schema_value(value["schema"])


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
