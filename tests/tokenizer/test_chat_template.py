"""ChatTemplate: where templates come from, HF conventions, sandboxing, TemplateError texts."""

from __future__ import annotations

import json

import pytest

from pytgi.errors import TemplateError
from pytgi.tokenizer.chat_template import ChatTemplate, find_template_source

USER = [{"role": "user", "content": "Hi"}]


def render(source: str, messages=USER, **kwargs) -> str:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, **kwargs)


def test_model_dir_template(bytelevel_dir):
    template = ChatTemplate.from_dir(bytelevel_dir, bos_token="<s>", eos_token="</s>")
    text = template.render([{"role": "system", "content": "Be brief."}, *USER])
    assert text == "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n"
    assert template.render(USER, add_generation_prompt=False) == "<|user|>\nHi</s>\n"


def test_raise_exception_is_a_template_error(bytelevel_dir):
    template = ChatTemplate.from_dir(bytelevel_dir)
    with pytest.raises(TemplateError) as info:
        template.render([{"role": "robot", "content": "x"}])
    assert info.value.message == "Template error: Unknown role: robot"
    assert info.value.status_code == 422 and info.value.error_type == "template_error"


def test_source_precedence(tmp_path):
    assert find_template_source(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "config"}))
    assert find_template_source(tmp_path) == "config"
    override = tmp_path / "override.json"
    override.write_text(json.dumps({"chat_template": [{"name": "default", "template": "ovr"}]}))
    assert find_template_source(tmp_path, override) == "ovr"
    (tmp_path / "chat_template.jinja").write_text("jinja file")
    assert find_template_source(tmp_path, override) == "jinja file"
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "json file"}))
    assert find_template_source(tmp_path, override) == "json file"


def test_named_templates_without_default(tmp_path):
    config = {"chat_template": [{"name": "tool_use", "template": "x"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert find_template_source(tmp_path) is None


def test_hf_conventions():
    source = (
        "{% for m in messages %}\n"
        "  {{- bos_token + m['content'] | upper }}\n"
        "{% endfor %}\n"
        "{{ {'é': 1} | tojson }}|{{ strftime_now('%Y') | length }}|{{ add_generation_prompt }}"
        "{% for i in range(3) %}{% if i == 1 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    )
    assert render(source) == '<s>HI\n{"é": 1}|4|True0'


def test_tools_and_generation_tags():
    source = (
        "{% generation %}{{ tools | length }}{% endgeneration %}"
        "{{ messages[0]['content'][0]['text'] }}"
    )
    assert render(source, tools=[{"a": 1}]) == "1Hi"
    assert ChatTemplate(source).uses_tools


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.system('id') }}",
        "{{ messages.append(1) }}",
        "{% for i in range(10**9) %}{% endfor %}",
        "{{ 'a' * 1000000000 }}",
        "{{ 2 ** 100000000 }}",
        "{{ messages[5]['content'] | upper }}{{ none.x() }}",
        "{% for %}",
    ],
)
def test_hostile_or_broken_templates_are_template_errors(source):
    with pytest.raises(TemplateError) as info:
        render(source)
    assert info.value.message.startswith("Template error: ")


def test_rendered_size_cap():
    with pytest.raises(TemplateError, match="too large"):
        render("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}")
