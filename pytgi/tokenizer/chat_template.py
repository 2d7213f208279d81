"""`ChatTemplate`: a model's Jinja chat template, rendered in a sandbox with HF conventions
(TGI_COMPATIBILITY.md §14).

Source, first found: `chat_template.json` (`{"chat_template": ...}`), `chat_template.jinja`, the
tokenizer config (`tokenizer_config.json` or `--tokenizer-config-path`), `processor_config.json`.
A value may be a string or a list of `{name, template}` (the one named "default" is used).

Rendering uses jinja2's `ImmutableSandboxedEnvironment` (no attribute escapes, no mutation of the
inputs, bounded `range`), with `trim_blocks`/`lstrip_blocks`, `raise_exception`, `strftime_now`
and HF's `tojson`; string repetition is capped so a template cannot exhaust memory. Any failure is
a `TemplateError("Template error: ...")`.
"""

from __future__ import annotations

import json
import operator
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pytgi.errors import TemplateError

MAX_RENDERED_CHARS = 4_000_000
_GENERATION_TAGS = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
# TGI's rewrite for templates that index the first message's content as a list of chunks
_FIRST_CHUNK_TEXT = "messages[0]['content'][0]['text']"


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Refuses `*` / `**` results too large to be a prompt (e.g. `'a' * 10**10`)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**":
            if isinstance(right, int) and right > 64:
                raise TemplateError("Template error: exponent too large")
            return operator.pow(left, right)
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, (str, list)) and isinstance(count, int):
                if len(seq) * count > MAX_RENDERED_CHARS:
                    raise TemplateError("Template error: repeated sequence too large")
        return operator.mul(left, right)


def _raise_exception(message: str) -> None:
    raise TemplateError(f"Template error: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> jinja2.Environment:
    env = _BoundedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None):
        self.source = _GENERATION_TAGS.sub("", source).replace(
            _FIRST_CHUNK_TEXT, "messages[0]['content']"
        )
        self.bos_token = bos_token or ""
        self.eos_token = eos_token or ""
        self.uses_tools = "tools" in self.source
        self.uses_tool_calls = "tool_calls" in self.source
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            self._template = None
            self._syntax_error = f"Template error: syntax error: {exc.message} (line {exc.lineno})"

    @classmethod
    def from_dir(
        cls,
        model_dir: str | Path,
        *,
        config_path: str | Path | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> ChatTemplate | None:
        """The model's template, or None when it has none."""
        source = find_template_source(Path(model_dir), config_path)
        if source is None:
            return None
        return cls(source, bos_token=bos_token, eos_token=eos_token)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        if self._template is None:
            raise TemplateError(self._syntax_error)
        context: dict[str, Any] = {
            "messages": messages,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_generation_prompt": add_generation_prompt,
        }
        if tools is not None:
            context["tools"] = tools
        try:
            text = self._template.render(**context)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise TemplateError(f"Template error: {exc}") from exc
        except (OverflowError, MemoryError, RecursionError) as exc:
            raise TemplateError(f"Template error: {type(exc).__name__}") from exc
        if len(text) > MAX_RENDERED_CHARS:
            raise TemplateError("Template error: rendered prompt too large")
        return text


def find_template_source(model_dir: Path, config_path: str | Path | None = None) -> str | None:
    candidates = [
        (model_dir / "chat_template.json", True),
        (model_dir / "chat_template.jinja", False),
        (Path(config_path) if config_path else model_dir / "tokenizer_config.json", True),
        (model_dir / "processor_config.json", True),
    ]
    for path, is_json in candidates:
        if not path.is_file():
            continue
        if not is_json:
            return path.read_text(encoding="utf-8")
        source = _select_template(_read_json(path).get("chat_template"))
        if source is not None:
            return source
    return None


def _select_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for entry in value:
            if isinstance(entry, dict) and entry.get("name") == "default":
                template = entry.get("template")
                return template if isinstance(template, str) else None
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TemplateError(f"Template error: cannot read {path.name}: {exc}") from exc
    return data if isinstance(data, dict) else {}
