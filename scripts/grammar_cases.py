"""Grammars for `bench_grammar_engines.py`: realistic JSON schemas and regexes (timed), and the bad
inputs of issue 12 item 5 (invalid, unsupported, pathological, enormous, unsatisfiable).

Each case is `(name, kind, value)` with kind "json" (a schema dict) or "regex" (a string).
"""

from __future__ import annotations

from typing import Any


def _tool(name: str, params: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """One `$functions` entry of TGI's tool grammar (router/tools.py builds the same shape)."""
    return {
        "type": "object",
        "properties": {"_name": {"type": "string", "const": name}, **params},
        "required": ["_name", *required],
        "additionalProperties": False,
    }


def _tool_grammar(tools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    refs = [{"$ref": f"#/$functions/{name}"} for name in tools]
    return {
        "$functions": tools,
        "type": "object",
        "properties": {"function": {"anyOf": refs}},
        "required": ["function"],
        "additionalProperties": False,
    }


WEATHER = _tool(
    "get_current_weather",
    {
        "location": {"type": "string", "description": "City and state, e.g. San Francisco, CA"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    ["location", "format"],
)
FORECAST = _tool(
    "get_n_day_weather_forecast",
    {
        "location": {"type": "string"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "num_days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    ["location", "format", "num_days"],
)
SEARCH = _tool(
    "web_search",
    {
        "query": {"type": "string"},
        "max_results": {"type": "integer"},
        "site": {"type": ["string", "null"]},
    },
    ["query"],
)
NO_TOOL = _tool("no_tool", {"content": {"type": "string"}}, ["content"])

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"type": "string", "enum": ["US", "CA", "MX", "FR", "DE"]},
            },
            "required": ["street", "city", "country"],
        },
        "phones": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["home", "work", "mobile"]},
                    "number": {"type": "string", "pattern": "^\\+?[0-9 ]{7,15}$"},
                },
                "required": ["kind", "number"],
            },
            "maxItems": 4,
        },
    },
    "required": ["name", "age", "address"],
}

PRODUCT = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "title": {"type": "string", "minLength": 1, "maxLength": 80},
        "price": {"type": "number", "minimum": 0},
        "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 8},
        "in_stock": {"type": "boolean"},
        "dimensions": {
            "type": "object",
            "properties": {
                "width": {"type": "number"},
                "height": {"type": "number"},
                "depth": {"type": "number"},
            },
            "required": ["width", "height"],
        },
    },
    "required": ["id", "title", "price", "currency", "in_stock"],
}

TREE = {
    "$defs": {
        "node": {
            "type": "object",
            "properties": {
                "label": {"type": "string"},
                "weight": {"type": "number"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
            },
            "required": ["label"],
        }
    },
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}, "depth": {"type": "integer"}},
    "required": ["root"],
}

SHAPES = {
    "type": "object",
    "properties": {
        "shapes": {
            "type": "array",
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                        "required": ["kind", "r"],
                    },
                    {
                        "type": "object",
                        "properties": {
                            "kind": {"const": "rect"},
                            "w": {"type": "number"},
                            "h": {"type": "number"},
                        },
                        "required": ["kind", "w", "h"],
                    },
                ]
            },
        }
    },
    "required": ["shapes"],
}

EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "date": {"type": "string", "format": "date"},
        "start": {"type": "string", "format": "date-time"},
        "attendees": {"type": "array", "items": {"type": "string", "format": "email"}},
        "priority": {"type": "integer", "enum": [1, 2, 3]},
        "location": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["title", "date"],
}

# 20 optional properties: the combinatorial case for order-aware JSON grammars
MANY_OPTIONAL = {
    "type": "object",
    "properties": {f"field_{i}": {"type": ["string", "integer"]} for i in range(20)},
}

TEN_TOOLS = _tool_grammar(
    {
        f"tool_{i}": _tool(
            f"tool_{i}",
            {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                "mode": {"enum": ["fast", "exact", "fuzzy"]},
                "filters": {"type": "array", "items": {"type": "string"}},
            },
            ["query"],
        )
        for i in range(10)
    }
)

REALISTIC: list[tuple[str, str, Any]] = [
    ("json_object", "json", {"type": "object"}),
    ("tool_weather", "json", _tool_grammar({"get_current_weather": WEATHER})),
    (
        "tools_auto_3",
        "json",
        _tool_grammar(
            {
                "get_current_weather": WEATHER,
                "get_n_day_weather_forecast": FORECAST,
                "no_tool": NO_TOOL,
            }
        ),
    ),
    ("tools_10", "json", TEN_TOOLS),
    ("tool_search_nullable", "json", _tool_grammar({"web_search": SEARCH})),
    ("person_nested", "json", PERSON),
    ("product_enums_arrays", "json", PRODUCT),
    ("tree_defs_ref", "json", TREE),
    ("shapes_oneof", "json", SHAPES),
    ("event_formats", "json", EVENT),
    ("many_optional_20", "json", MANY_OPTIONAL),
    ("re_phone", "regex", r"\(\d{3}\) \d{3}-\d{4}"),
    ("re_email", "regex", r"[a-z0-9._%+-]{1,32}@[a-z0-9.-]{1,32}\.[a-z]{2,4}"),
    ("re_ipv4", "regex", r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"),
    ("re_date", "regex", r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3])"),
    ("re_choice", "regex", r"(yes|no|maybe)"),
    ("re_sentence", "regex", r"[A-Z][a-z]+( [a-z]+){3,12}\."),
]


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"]}
    return node


BAD: list[tuple[str, str, Any]] = [
    # invalid schemas
    ("invalid_type", "json", {"type": "object", "properties": {"a": {"type": "stsring"}}}),
    ("dangling_ref", "json", {"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}}),
    ("required_not_list", "json", {"type": "object", "properties": {}, "required": "a"}),
    # unsupported keywords
    (
        "if_then_else",
        "json",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "if": {"properties": {"a": {"const": "x"}}},
            "then": {"required": ["a"]},
        },
    ),
    ("unique_items", "json", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}),
    ("contains", "json", {"type": "array", "contains": {"type": "integer"}}),
    (
        "dependent_required",
        "json",
        {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": ["b"]}},
    ),
    ("pattern_lookahead", "json", {"type": "string", "pattern": "^(?=a)a+$"}),
    # pathological regexes
    ("re_backtrack_nested", "regex", r"(a+)+b"),
    ("re_backtrack_alt", "regex", r"(a|aa)*c"),
    ("re_dfa_blowup_20", "regex", r"[ab]*a[ab]{20}"),
    ("re_dfa_blowup_40", "regex", r"[ab]*a[ab]{40}"),
    ("re_nested_repeat", "regex", r"((a{1,10}){1,10}){1,10}"),
    ("re_unicode_word_200", "regex", r"\w{200}"),
    # huge repetition counts
    ("re_rep_1e6", "regex", r"a{1000000}"),
    ("re_rep_range_1e5", "regex", r"[a-z]{0,100000}"),
    ("re_rep_nested_1e3", "regex", r"(a{1000}){1000}"),
    ("min_length_1e6", "json", {"type": "string", "minLength": 1000000}),
    ("min_items_1e5", "json", {"type": "array", "items": {"type": "integer"}, "minItems": 100000}),
    ("int_range_huge", "json", {"type": "integer", "minimum": -(10**15), "maximum": 10**15}),
    # enormous schemas
    ("enum_10000", "json", {"enum": [f"value_{i}" for i in range(10000)]}),
    (
        "properties_1000",
        "json",
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer"} for i in range(1000)},
            "required": [f"p{i}" for i in range(1000)],
        },
    ),
    ("nesting_200", "json", _deep(200)),
    (
        "tools_1000",
        "json",
        _tool_grammar({f"tool_{i}": _tool(f"tool_{i}", {}, []) for i in range(1000)}),
    ),
    # unsatisfiable
    ("unsat_min_gt_max", "json", {"type": "integer", "minimum": 5, "maximum": 3}),
    ("unsat_allof_types", "json", {"allOf": [{"type": "string"}, {"type": "integer"}]}),
    ("unsat_empty_enum", "json", {"enum": []}),
    (
        "unsat_required_forbidden",
        "json",
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    ),
    ("unsat_length", "json", {"type": "string", "minLength": 5, "maxLength": 2}),
    ("unsat_re_empty_class", "regex", r"[^\s\S]"),
    ("unsat_re_anchor", "regex", r"a^b"),
]
