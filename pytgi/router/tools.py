"""OpenAI `tools` + `tool_choice` → TGI's tool grammar and prompt text, and tool calls parsed back
out of generated text (TGI_COMPATIBILITY.md §14).

TGI constrains the output to `{"function": {"_name": <tool>, <arguments>}}` with a JSON-schema
grammar. Where the engine enforces grammars the output always has that form; where it does not
(the grammar is then only built), a tool call relies on the model emitting the JSON itself, and
the parser also accepts the `{"name": ..., "parameters"|"arguments": {...}}` shape the default
tool prompt asks for, inside code fences or tags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytgi.router.errors import tool_error
from pytgi.router.grammar import schema_problem
from pytgi.router.outputs import ToolCall

NO_TOOL = "no_tool"
DEFAULT_TOOL_PROMPT = (
    "\nGiven the functions available, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt. Respond in the format {name: function "
    "name, parameters: dictionary of argument name and its value}.Do not use variables.\n"
)
NO_TOOL_FUNCTION: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": NO_TOOL,
        "description": "Open ended response with no specific tool selected",
        "parameters": {
            "type": "object",
            "properties": {"content": {"type": "string", "description": "The response content"}},
            "required": ["content"],
        },
    },
}


@dataclass(frozen=True)
class ToolSelection:
    """The tools in effect after `tool_choice` and the grammar that forces a call to one."""

    tools: list[dict[str, Any]]
    grammar_schema: dict[str, Any]
    mode: str  # "auto" (no_tool allowed), "required" or "named"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)


def select_tools(
    tools: Sequence[Mapping[str, Any]] | None, tool_choice: str | Mapping[str, Any] | None
) -> ToolSelection | None:
    """Apply `tool_choice`; None means answer without tools (no tools, or "none")."""
    if not tools:
        return None
    checked = [_check_tool(t) for t in tools]
    choice = _choice_name(tool_choice)
    if choice == "none":
        return None
    if choice == "auto":
        selected, mode = checked + [NO_TOOL_FUNCTION], "auto"
    elif choice == "required":
        selected, mode = checked, "required"
    else:
        selected = [t for t in checked if t["function"]["name"] == choice]
        if not selected:
            raise tool_error(f"Tool with name {choice} not found")
        mode = "named"
    return ToolSelection(selected, tool_grammar(selected), mode)


def tool_grammar(tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """TGI's JSON schema: `{"function": <one of the tools, named by a `_name` const>}`.

    Stricter than TGI's in two ways, so that constrained output is always a call: the root is a
    closed object that requires `function` (TGI's root has no `type`, which JSON Schema reads as
    "any value"), and the parameters' `$defs`/`definitions` (pydantic's nested models, referenced
    as `#/$defs/...`) move to the root, where their references point.
    """
    functions: dict[str, Any] = {}
    defs: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool["function"]
        params = fn.get("parameters") or {}
        spec: dict[str, Any] = {
            "type": "object",
            "properties": {
                "_name": {"type": "string", "const": fn["name"]},
                **params.get("properties", {}),
            },
            "required": ["_name", *params.get("required", [])],
            "additionalProperties": False,
        }
        if fn.get("description"):
            spec["description"] = fn["description"]
        functions[fn["name"]] = spec
        _merge_defs(defs, params, fn["name"])
    refs = [{"$ref": f"#/$functions/{name}"} for name in functions]
    schema = {
        "$functions": functions,
        "type": "object",
        "properties": {"function": {"anyOf": refs}},
        "required": ["function"],
        "additionalProperties": False,
    }
    schema.update({key: value for key, value in defs.items() if value})
    return schema


def _merge_defs(defs: dict[str, dict[str, Any]], params: Mapping[str, Any], tool: str) -> None:
    for key in ("$defs", "definitions"):
        for name, definition in (params.get(key) or {}).items():
            known = defs.setdefault(key, {})
            if name in known and known[name] != definition:
                raise tool_error(f"tools define `{key}/{name}` differently (tool {tool})")
            known[name] = definition


def tool_prompt_suffix(
    selection: ToolSelection, tool_prompt: str | None, template_uses_tools: bool
) -> str:
    """Text TGI appends to the last message: the tool list (unless the template shows it)."""
    prompt = DEFAULT_TOOL_PROMPT if tool_prompt is None else tool_prompt
    if template_uses_tools:
        return f"\n---\n{prompt}"
    return f"\n---\n{json.dumps(selection.tools)}\n{prompt}"


def parse_tool_call(text: str, allowed: Sequence[str] = (), *, auto: bool = False) -> ToolCall:
    """The tool call in `text`: TGI's `{"function": {"_name": ...}}` or `{"name", "parameters"}`.

    With `auto`, text that is not a tool call is a `no_tool` answer (the model chose not to call
    one). `allowed` (when given) is the set of selected tool names.
    """
    try:
        call = _extract_call(text)
    except ValueError as exc:
        if auto:
            return ToolCall(NO_TOOL, {"content": text})
        raise tool_error(f"Failed to parse generated text: {exc}") from exc
    if allowed and call.name not in allowed and call.name != NO_TOOL:
        raise tool_error(f"Tool with name {call.name} not found")
    return call


def _check_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise tool_error("each tool needs a `function` with a `name`")
    params = fn.get("parameters", fn.get("arguments"))
    if params is not None:
        if not isinstance(params, Mapping):
            raise tool_error(f"parameters of tool {fn['name']} must be a JSON schema object")
        problem = schema_problem(dict(params))
        if problem:
            raise tool_error(f"invalid parameters for tool {fn['name']}: {problem}")
    function = {k: v for k, v in fn.items() if k != "arguments"}
    function["parameters"] = dict(params) if params is not None else {"type": "object"}
    return {"type": tool.get("type", "function"), "function": function}


def _choice_name(tool_choice: str | Mapping[str, Any] | None) -> str:
    if tool_choice is None:
        return "auto"
    if isinstance(tool_choice, str):
        return tool_choice
    fn = tool_choice.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
        return fn["name"]
    kind = tool_choice.get("type")
    if kind in ("auto", "none", "required"):
        return kind
    raise tool_error("`tool_choice` must be auto, none, required or name a function")


def _extract_call(text: str) -> ToolCall:
    value = _first_json_object(text)
    fn = value.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("_name"), str):
        args = {k: v for k, v in fn.items() if k != "_name"}
        return ToolCall(fn["_name"], args)
    target = fn if isinstance(fn, dict) and "name" in fn else value
    name = target.get("name")
    if not isinstance(name, str):
        raise ValueError("no function name in the generated JSON")
    args = target.get("parameters", target.get("arguments", {}))
    if isinstance(args, str):
        args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError("function arguments are not a JSON object")
    return ToolCall(name, args)


def _first_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in `text` (models wrap calls in code fences or tags)."""
    decoder = json.JSONDecoder()
    pos = text.find("{")
    while pos >= 0:
        try:
            value, _ = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(value, dict):
            return value
        pos = text.find("{", pos + 1)
    raise ValueError("no JSON object found")
