"""Tool selection, TGI's tool grammar and prompt text, and parsing tool calls back."""

from __future__ import annotations

import json

import pytest

from pytgi.errors import ToolError
from pytgi.router.tools import (
    DEFAULT_TOOL_PROMPT,
    NO_TOOL,
    parse_tool_call,
    select_tools,
    tool_prompt_suffix,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["location"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}


def test_auto_adds_no_tool_and_builds_tgi_grammar():
    sel = select_tools([WEATHER, TIME], None)
    assert sel.mode == "auto" and sel.names == ("get_weather", "get_time", NO_TOOL)
    schema = sel.grammar_schema
    assert schema["properties"]["function"]["anyOf"][0] == {"$ref": "#/$functions/get_weather"}
    weather = schema["$functions"]["get_weather"]
    assert weather["properties"]["_name"] == {"type": "string", "const": "get_weather"}
    assert weather["required"] == ["_name", "location"]
    assert weather["additionalProperties"] is False
    assert schema["$functions"]["get_time"]["required"] == ["_name"]


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        ("required", ("get_weather", "get_time")),
        ("get_time", ("get_time",)),
        ({"type": "function", "function": {"name": "get_weather"}}, ("get_weather",)),
        ({"type": "auto"}, ("get_weather", "get_time", NO_TOOL)),
    ],
)
def test_tool_choice(choice, names):
    assert select_tools([WEATHER, TIME], choice).names == names


def test_none_and_empty_tools_mean_no_tool_mode():
    assert select_tools([WEATHER], "none") is None
    assert select_tools([], "required") is None
    assert select_tools(None, None) is None


def test_unknown_named_tool():
    with pytest.raises(ToolError) as info:
        select_tools([WEATHER], "launch_rocket")
    assert info.value.message == "Tool error: Tool with name launch_rocket not found"
    assert info.value.status_code == 422 and info.value.error_type == "tool_error"


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "function", "function": {"description": "no name"}},
        {"type": "function", "function": {"name": "x", "parameters": [1]}},
        {"type": "function", "function": {"name": "x", "parameters": {"type": "strng"}}},
    ],
)
def test_invalid_tools(tool):
    with pytest.raises(ToolError, match="^Tool error: "):
        select_tools([tool], None)


def test_prompt_suffix():
    sel = select_tools([WEATHER], "required")
    listed = tool_prompt_suffix(sel, None, template_uses_tools=False)
    assert listed == f"\n---\n{json.dumps(sel.tools)}\n{DEFAULT_TOOL_PROMPT}"
    assert tool_prompt_suffix(sel, "Use a tool.", template_uses_tools=True) == "\n---\nUse a tool."


@pytest.mark.parametrize(
    "text",
    [
        '{"function": {"_name": "get_weather", "location": "Paris"}}',
        '{"name": "get_weather", "parameters": {"location": "Paris"}}',
        '```json\n{"name": "get_weather", "arguments": "{\\"location\\": \\"Paris\\"}"}\n```',
        '<tool_call>{"function": {"name": "get_weather", "arguments": {"location": "Paris"}}}',
    ],
)
def test_parse_tool_call_shapes(text):
    call = parse_tool_call(text, ("get_weather", NO_TOOL))
    assert call.name == "get_weather" and call.arguments == {"location": "Paris"}


def test_parse_empty_arguments():
    assert parse_tool_call('{"function": {"_name": "get_time"}}').arguments == {}
    assert parse_tool_call('{"name": "get_time", "arguments": ""}').arguments == {}


def test_parse_errors():
    with pytest.raises(ToolError) as info:
        parse_tool_call("I think it is sunny.")
    assert info.value.message.startswith("Tool error: Failed to parse generated text: ")
    with pytest.raises(ToolError, match="Tool with name rm_rf not found"):
        parse_tool_call('{"name": "rm_rf", "parameters": {}}', ("get_weather",))
    with pytest.raises(ToolError, match="arguments are not a JSON object"):
        parse_tool_call('{"name": "get_weather", "parameters": [1]}')


def test_auto_mode_plain_text_is_no_tool():
    call = parse_tool_call("It is sunny.", ("get_weather", NO_TOOL), auto=True)
    assert call.name == NO_TOOL and call.arguments == {"content": "It is sunny."}
    tgi = parse_tool_call('{"function": {"_name": "no_tool", "content": "Hi"}}', auto=True)
    assert tgi.name == NO_TOOL and tgi.arguments == {"content": "Hi"}
