"""`ChatRenderer`: chat messages (+ tools, tool_choice, response_format) → a prompt
(TGI_COMPATIBILITY.md §8, §14).

Messages are normalised as TGI does before templating: multimodal content lists become one
string (text chunks, images as `![](url)`), assistant tool calls become JSON text unless the
template renders `tool_calls` itself. A last message from the assistant is continued rather
than answered. Tools are selected by `tool_choice` and described to the model in the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pytgi.errors import TemplateError
from pytgi.router.errors import tool_error
from pytgi.router.outputs import ChatPrompt
from pytgi.router.params import GrammarParam
from pytgi.router.tools import select_tools, tool_prompt_suffix
from pytgi.tokenizer.chat_template import ChatTemplate
from pytgi.tokenizer.tokenizer import Tokenizer

_KEPT_KEYS = ("name", "tool_call_id")


class ChatRenderer:
    def __init__(self, tokenizer: Tokenizer, *, grammar_enforced: bool = False):
        self.tokenizer = tokenizer
        self.grammar_enforced = grammar_enforced
        self._template: ChatTemplate | None = None
        self._loaded = False

    @property
    def template(self) -> ChatTemplate | None:
        """Loaded on first use from the tokenizer's model directory."""
        if not self._loaded:
            tok = self.tokenizer
            if tok.model_dir is not None:
                self._template = ChatTemplate.from_dir(
                    tok.model_dir,
                    config_path=tok.config_path,
                    bos_token=tok.bos_token,
                    eos_token=tok.eos_token,
                )
            self._loaded = True
        return self._template

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        tool_prompt: str | None = None,
        response_format: GrammarParam | None = None,
    ) -> ChatPrompt:
        if response_format is not None and tools is not None:
            raise tool_error("Grammar and tools are mutually exclusive")
        template = self.template
        if template is None:
            raise TemplateError("Template error: template not found")
        msgs = [normalize_message(m, template.uses_tool_calls) for m in messages]
        selection = select_tools(tools, tool_choice)
        if selection is None:
            return ChatPrompt(render_prompt(template, msgs), grammar=response_format)
        if msgs:
            suffix = tool_prompt_suffix(selection, tool_prompt, template.uses_tools)
            msgs[-1]["content"] = msgs[-1]["content"] + suffix
        shown = selection.tools if template.uses_tools else None
        grammar = GrammarParam(type="json", value=selection.grammar_schema)
        return ChatPrompt(
            render_prompt(template, msgs, tools=shown),
            grammar=grammar if self.grammar_enforced else None,
            tool_names=selection.names,
            tool_grammar=grammar,
            tool_mode=selection.mode,
        )


def render_prompt(
    template: ChatTemplate, messages: list[dict[str, Any]], *, tools: list | None = None
) -> str:
    """Render with a generation prompt; continue a final assistant message instead
    (TGI_COMPATIBILITY.md §14)."""
    text = template.render(messages, add_generation_prompt=True, tools=tools)
    if messages and messages[-1]["role"] == "assistant":
        content = messages[-1]["content"]
        index = text.rfind(content)
        if index >= 0:
            text = text[: index + len(content)].rstrip()
    return text


def normalize_message(message: Any, keep_tool_calls: bool) -> dict[str, Any]:
    data = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else message
    if not isinstance(data, Mapping):
        raise TemplateError("Template error: a message must be an object")
    out: dict[str, Any] = {"role": str(data.get("role", "")), "content": _text(data.get("content"))}
    out.update({k: data[k] for k in _KEPT_KEYS if data.get(k) is not None})
    tool_calls = data.get("tool_calls")
    if tool_calls:
        if keep_tool_calls:
            out["tool_calls"] = list(tool_calls)
        elif not out["content"]:
            out["content"] = json.dumps(tool_calls)
    return out


def _text(content: Any) -> str:
    """String content as is; a list of chunks joined (images inlined as markdown)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_chunk_text(c) for c in content)
    raise TemplateError("Template error: message content must be a string or a list of parts")


def _chunk_text(chunk: Any) -> str:
    if isinstance(chunk, str):
        return chunk
    if not isinstance(chunk, Mapping):
        raise TemplateError("Template error: a content part must be an object")
    if chunk.get("type") == "image_url":
        image = chunk.get("image_url") or {}
        url = image.get("url", "") if isinstance(image, Mapping) else str(image)
        return f"![]({url})"
    text = chunk.get("text")
    return text if isinstance(text, str) else ""
