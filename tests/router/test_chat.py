"""ChatRenderer: message normalisation, continue-final-message, tools and response_format."""

from __future__ import annotations

import json

import pytest

from pytgi.errors import TemplateError, ToolError
from pytgi.router.chat import ChatRenderer
from pytgi.router.params import GrammarParam
from pytgi.router.tools import NO_TOOL
from pytgi.tokenizer.tokenizer import Tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
TOOLS_TEMPLATE = (
    "{% if tools %}[TOOLS]{{ tools | map(attribute='function.name') | join(',') }}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }}{% endfor %}{% endfor %}"
)


@pytest.fixture
def renderer(tokenizer) -> ChatRenderer:
    return ChatRenderer(tokenizer)


def renderer_with(tmp_path, tokenizer_dir, template: str | None) -> ChatRenderer:
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    if template is not None:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    return ChatRenderer(Tokenizer.from_dir(tmp_path))


def test_plain_chat(renderer):
    prompt = renderer.render([{"role": "user", "content": "Hi"}])
    assert prompt.text == "<|user|>\nHi</s>\n<|assistant|>\n"
    assert prompt.grammar is None and not prompt.uses_tools


def test_multimodal_content_is_flattened(renderer):
    content = [
        {"type": "text", "text": "What is this? "},
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
    ]
    prompt = renderer.render([{"role": "user", "content": content}])
    assert "What is this? ![](https://x/cat.png)</s>" in prompt.text


def test_continue_final_assistant_message(renderer):
    messages = [
        {"role": "user", "content": "Count"},
        {"role": "assistant", "content": "1, 2, "},
    ]
    assert renderer.render(messages).text == "<|user|>\nCount</s>\n<|assistant|>\n1, 2,"


def test_assistant_tool_calls_become_json_content(renderer):
    calls = [{"id": "0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "done", "tool_call_id": "0"},
    ]
    text = renderer.render(messages).text
    assert f"<|assistant|>\n{json.dumps(calls)}</s>" in text and "<|tool|>\ndone" in text


def test_template_that_renders_tool_calls_gets_them(tmp_path, tokenizer_dir):
    r = renderer_with(tmp_path, tokenizer_dir, TOOLS_TEMPLATE)
    calls = [{"id": "0", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    text = r.render([{"role": "assistant", "content": None, "tool_calls": calls}]).text
    assert text == "<assistant>CALL f"


def test_missing_template(tmp_path, tokenizer_dir):
    r = renderer_with(tmp_path, tokenizer_dir, None)
    with pytest.raises(TemplateError) as info:
        r.render([{"role": "user", "content": "Hi"}])
    assert info.value.message == "Template error: template not found"


def test_tools_are_injected_into_the_last_message(renderer):
    prompt = renderer.render([{"role": "user", "content": "Weather?"}], tools=[WEATHER])
    assert prompt.tool_names == ("get_weather", NO_TOOL) and prompt.tool_mode == "auto"
    assert "Weather?\n---\n[" in prompt.text and '"name": "no_tool"' in prompt.text
    assert prompt.grammar is None  # the engine cannot enforce it yet
    assert prompt.tool_grammar.type == "json"
    assert "$functions" in prompt.tool_grammar.value


def test_template_with_tools_gets_them(tmp_path, tokenizer_dir):
    r = renderer_with(tmp_path, tokenizer_dir, TOOLS_TEMPLATE)
    prompt = r.render([{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_prompt="Call!")
    assert prompt.text == "[TOOLS]get_weather,no_tool<user>Hi\n---\nCall!"


def test_tool_choice_none_renders_plainly(renderer):
    prompt = renderer.render(
        [{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice="none"
    )
    assert prompt.text == "<|user|>\nHi</s>\n<|assistant|>\n" and not prompt.uses_tools


def test_response_format_and_tools_are_exclusive(renderer):
    fmt = GrammarParam(type="json_object")
    for tools in ([WEATHER], []):
        with pytest.raises(ToolError) as info:
            renderer.render([{"role": "user", "content": "Hi"}], tools=tools, response_format=fmt)
        assert info.value.message == "Tool error: Grammar and tools are mutually exclusive"
    assert renderer.render([{"role": "user", "content": "Hi"}], response_format=fmt).grammar == fmt


def test_infer_parse_tool_call_uses_the_prompt(tokenizer, limits, cache_info):
    from pytgi.router.infer import Infer

    infer = Infer(None, tokenizer, limits, cache_info)
    prompt = infer.render_chat([{"role": "user", "content": "Hi"}], tools=[WEATHER])
    assert infer.parse_tool_call("Hello there", prompt).name == NO_TOOL
    call = infer.parse_tool_call('{"function": {"_name": "get_weather"}}', prompt)
    assert call.name == "get_weather"
    required = infer.render_chat(
        [{"role": "user", "content": "Hi"}], tools=[WEATHER], tool_choice="required"
    )
    with pytest.raises(ToolError):
        infer.parse_tool_call("Hello there", required)
