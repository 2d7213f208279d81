"""Grammars the grammar tests decode and reject: realistic schemas, regexes, bad inputs."""

from __future__ import annotations

from typing import Any

from pytgi.router.tools import NO_TOOL, tool_grammar

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "maxLength": 30},
                "format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "format"],
        },
    },
}
# pydantic's shape for a nested model: `$defs` at the parameters' root, referenced from a property
ADDRESS_TOOL = {
    "type": "function",
    "function": {
        "name": "ship",
        "parameters": {
            "$defs": {
                "Address": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 20},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["city", "zip"],
                    "additionalProperties": False,
                }
            },
            "type": "object",
            "properties": {"to": {"$ref": "#/$defs/Address"}, "express": {"type": "boolean"}},
            "required": ["to"],
        },
    },
}
EMPTY_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
# TGI's no_tool pseudo-tool, its free text bounded: random logits rarely close an unbounded string
NO_TOOL_SHORT = {
    "type": "function",
    "function": {
        "name": NO_TOOL,
        "parameters": {
            "type": "object",
            "properties": {"content": {"type": "string", "maxLength": 40}},
            "required": ["content"],
        },
    },
}
SHORT = {"maxLength": 8, "maxItems": 3}

SCHEMAS: dict[str, dict[str, Any]] = {
    "json_object": {
        "type": "object",
        "maxProperties": 3,
        "patternProperties": {"^[a-z_]{1,8}$": {"type": ["string", "integer", "array"], **SHORT}},
        "additionalProperties": False,
    },
    "tools_auto": tool_grammar([WEATHER_TOOL, ADDRESS_TOOL, EMPTY_TOOL, NO_TOOL_SHORT]),
    "person_nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "country": {"enum": ["US", "FR", "DE"]},
                },
                "required": ["city", "country"],
                "additionalProperties": False,
            },
            "phones": {
                "type": "array",
                "items": {"type": "string", "pattern": "^\\+?[0-9]{7,12}$"},
                "maxItems": 3,
            },
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
    },
    "product_enums_numbers": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "currency": {"const": "EUR"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1},
            "stock": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        },
        "required": ["id", "price", "currency", "tags", "stock"],
        "additionalProperties": False,
    },
    "tree_defs_ref": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "maxLength": 6},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["label"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/node"}},
        "required": ["root"],
        "additionalProperties": False,
    },
    "shapes_oneof": {
        "type": "array",
        "maxItems": 3,
        "items": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                    "required": ["kind", "r"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
                    "required": ["kind", "side"],
                    "additionalProperties": False,
                },
            ]
        },
    },
    "formats": {
        "type": "object",
        "properties": {
            "day": {"type": "string", "format": "date"},
            "email": {"type": "string", "format": "email", "maxLength": 24},
            "id": {"type": "string", "format": "uuid"},
        },
        "required": ["day", "email", "id"],
        "additionalProperties": False,
    },
}

REGEXES: dict[str, str] = {
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "email": r"[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,20}\.[a-z]{2,4}",
    "ipv4": r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)",
    "date": r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    "choice": r"(yes|no|maybe)",
    "words": r"[A-Z][a-z]{1,8}( [a-z]{1,8}){2,5}\.",
    "word_class": r"\w{3,6}-\s?\w+",
}

# rejected before admission by the tokenizer-free check: (name, kind, value, message part)
INVALID: list[tuple[str, str, Any, str]] = [
    ("invalid_type", "json", {"properties": {"a": {"type": "stsring"}}}, "stsring"),
    ("dangling_ref", "json", {"properties": {"a": {"$ref": "#/$defs/nope"}}}, "does not exist"),
    ("required_not_list", "json", {"properties": {}, "required": "a"}, "required"),
    (
        "if_then",
        "json",
        {"properties": {"a": {"type": "string"}}, "if": {"required": ["a"]}, "then": {}},
        "Unimplemented keys",
    ),
    ("unique_items", "json", {"type": "array", "uniqueItems": True}, "uniqueItems"),
    ("contains", "json", {"type": "array", "contains": {"type": "integer"}}, "contains"),
    ("pattern_lookahead", "json", {"type": "string", "pattern": "^(?=a)a+$"}, "look-around"),
    ("min_gt_max", "json", {"type": "integer", "minimum": 5, "maximum": 3}, "Unsatisfiable"),
    ("allof_types", "json", {"allOf": [{"type": "string"}, {"type": "integer"}]}, "Unsatisfiable"),
    ("empty_enum", "json", {"enum": []}, "Unsatisfiable"),
    (
        "required_forbidden",
        "json",
        {
            "type": "object",
            "properties": {"a": {}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "Unsatisfiable",
    ),
    ("length", "json", {"type": "string", "minLength": 5, "maxLength": 2}, "Unsatisfiable"),
    ("regex_lookbehind", "regex", r"(?<=a)b", "look-around"),
    ("regex_backreference", "regex", r"(a)\1", "backreferences"),
    ("regex_anchor_inside", "regex", r"a^b", "not supported"),
]


def deep_schema(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


def many_tools(n: int) -> dict[str, Any]:
    return tool_grammar([{"function": {"name": f"t{i}", "parameters": {}}} for i in range(n)])
