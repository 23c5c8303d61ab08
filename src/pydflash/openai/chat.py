"""Chat templates: the GGUF's own template (``tokenizer.chat_template``, jinja,
rendered by llama.cpp's common/chat), an explicit jinja source, or a llama.cpp
built-in template name; ChatML when the model has none (as llama.cpp does)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from ..config import schema_json

__all__ = ["ChatPrompt", "ChatReply", "ChatTemplate", "builtin_templates", "resolve_tool_choice"]

# OpenAI's tool_choice: "auto", "none", "required", or {"type": "function", "function": {"name": ...}}
ToolChoice = str | Mapping[str, Any]
TOOL_CHOICES = ("auto", "none", "required")

_CHATML_END = "<|im_end|>"


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """What a template made of a conversation: the prompt text (and, for a template with a
    model, its token ids: ``tokens``), the stop strings the template asks for, and how to
    read the reply (``format``, reasoning tags)."""

    prompt: str
    stop: tuple[str, ...]
    generation_prompt: str
    format: str
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]
    format_id: int = dataclasses.field(repr=False, default=0)
    parser: str = dataclasses.field(repr=False, default="")
    # the reply's grammar as the template builds it (tool calls, a JSON schema, a user
    # grammar); lazy: only once a trigger (a regex on the output, or a token) appears
    grammar: str = dataclasses.field(repr=False, default="")
    grammar_lazy: bool = dataclasses.field(repr=False, default=False)
    grammar_trigger_patterns: tuple[str, ...] = dataclasses.field(repr=False, default=())
    grammar_trigger_tokens: tuple[int, ...] = dataclasses.field(repr=False, default=())
    # the prompt's token ids as a generation reads them (BOS where the vocabulary asks for it,
    # special tokens parsed), made by the core in the call that rendered the text; None: the
    # template has no model
    tokens: tuple[int, ...] | None = dataclasses.field(repr=False, default=None)

    @property
    def needs_parse(self) -> bool:
        """Whether the reply must go through llama.cpp's reply parser (reasoning, tool calls)."""
        return bool(self.parser) or self.format_id != 0 or self.supports_thinking


@dataclasses.dataclass(frozen=True)
class ChatReply:
    """A model's reply parsed by its template's format: the text, the reasoning block's text and
    the tool calls as (name, arguments JSON, id)."""

    content: str
    reasoning_content: str
    tool_calls: tuple[tuple[str, str, str], ...]  # (name, arguments JSON, id)


def builtin_templates() -> list[str]:
    """Names of llama.cpp's built-in (non-jinja) chat templates."""
    return list(_core.ChatTemplate.builtin_names())


class ChatTemplate:
    """A chat template bound to a model's vocabulary (for its BOS/EOS tokens).

    ``source=None`` uses the model's own template (ChatML when it has none); a
    llama.cpp built-in name (see ``builtin_templates()``) or jinja source overrides it.
    A template that does not parse raises ``ChatTemplateError``."""

    def __init__(
        self, model: _core.Model | None, source: str | None = None, *, bos_token: str = "", eos_token: str = ""
    ):
        if source is not None and not isinstance(source, str):
            raise TypeError(f"chat template must be str, not {type(source).__name__}")
        self._t = _core.ChatTemplate(model, source or "", bos_token, eos_token)
        self._fallback = model is not None and not source and not self._t.has_model_template

    @property
    def source(self) -> str:
        """The template's jinja source."""
        return self._t.source

    @property
    def is_fallback(self) -> bool:
        """True when the model has no template of its own and ChatML is used."""
        return self._fallback

    @property
    def supports_thinking(self) -> bool:
        """Whether the template has a switch for thinking (``enable_thinking``)."""
        return self._t.supports_thinking

    def apply(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        json_schema: Mapping[str, Any] | None = None,
        grammar: str | None = None,
        tool_choice: ToolChoice | None = None,
        **template_kwargs: Any,
    ) -> ChatPrompt:
        """Render ``messages`` (OpenAI-style dicts) into a prompt; ``json_schema`` or
        ``grammar`` (GBNF) constrain the reply, as the template combines them with its
        own format (``ChatPrompt.grammar``); ``tool_choice``: see ``resolve_tool_choice()``."""
        _check_messages(messages)
        tools, choice = resolve_tool_choice(tools, tool_choice)
        try:
            mj = json.dumps(list(messages))
            tj = json.dumps(list(tools)) if tools else ""
            kj = json.dumps(template_kwargs) if template_kwargs else ""
            sj = schema_json(json_schema) if json_schema is not None else ""
        except (TypeError, ValueError) as e:
            raise TypeError(f"messages, tools and template arguments must be JSON-serialisable: {e}") from None
        d = self._t.apply(mj, add_generation_prompt, enable_thinking, tj, kj, sj, grammar or "", choice)
        stops = _strs(d["additional_stops"])
        if self._fallback and _CHATML_END not in stops:
            stops.append(_CHATML_END)
        return ChatPrompt(
            prompt=str(d["prompt"]),
            stop=tuple(stops),
            generation_prompt=str(d["generation_prompt"]),
            format=str(d["format"]),
            supports_thinking=bool(d["supports_thinking"]),
            thinking_start_tag=str(d["thinking_start_tag"]),
            thinking_end_tags=tuple(_strs(d["thinking_end_tags"])),
            format_id=_int(d["format_id"]),
            parser=str(d["parser"]),
            grammar=str(d["grammar"]),
            grammar_lazy=bool(d["grammar_lazy"]),
            grammar_trigger_patterns=tuple(_strs(d["grammar_trigger_patterns"])),
            grammar_trigger_tokens=tuple(_int(t) for t in _seq(d["grammar_trigger_tokens"])),
            tokens=None if d["tokens"] is None else tuple(_int(t) for t in _seq(d["tokens"])),
        )

    @staticmethod
    def parse(text: str, prompt: ChatPrompt, *, extract_reasoning: bool = True, partial: bool = False) -> ChatReply:
        """Split a generated reply into content, reasoning and tool calls with the
        template's reply parser. Raises ``ChatTemplateError`` when it does not match."""
        if not prompt.needs_parse:
            return ChatReply(text, "", ())
        d = _core.ChatTemplate.parse(
            text, prompt.format_id, prompt.generation_prompt, prompt.parser, extract_reasoning, partial
        )
        calls = d["tool_calls"]
        if not isinstance(calls, (list, tuple)):
            raise TypeError(f"the core's tool_calls must be a list, not {type(calls).__name__}")
        return ChatReply(str(d["content"]), str(d["reasoning_content"]), tuple(_tool_call(c) for c in calls))


def resolve_tool_choice(
    tools: Sequence[Mapping[str, Any]] | None, choice: ToolChoice | None
) -> tuple[Sequence[Mapping[str, Any]] | None, str]:
    """The tools the template offers and llama.cpp's tool choice for OpenAI's ``tool_choice``:
    "auto" (None; the model may call one), "none" (the tools are shown, no call is read) or
    "required" (a call is forced from the first token: the tool-call grammar is not lazy), as
    llama-server; a named function (``{"type": "function", "function": {"name": ...}}``)
    offers that tool alone, required (llama-server reads it as "auto")."""
    if choice is None:
        return tools, "auto"
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ValueError(f"tool_choice must be {', '.join(TOOL_CHOICES)} or a named function, got {choice!r}")
        return tools, choice
    if not isinstance(choice, Mapping):
        raise TypeError(f"tool_choice must be a str or a dict, not {type(choice).__name__}")
    function = choice.get("function")
    name = function.get("name") if choice.get("type") == "function" and isinstance(function, Mapping) else None
    if not isinstance(name, str):
        raise ValueError("a tool_choice dict names a function: {'type': 'function', 'function': {'name': ...}}")
    named = [t for t in tools or () if isinstance(t.get("function"), Mapping) and t["function"].get("name") == name]
    if not named:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return named, "required"


# The core returns dicts of plain values (str, int, lists): these read them with
# the type they must have (a TypeError would be a binding bug).


def _strs(value: object) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise TypeError(f"expected a list of str from the core, got {value!r}")
    return list(value)


def _seq(value: object) -> list[object]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list from the core, got {value!r}")
    return list(value)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int from the core, got {value!r}")
    return value


def _tool_call(value: object) -> tuple[str, str, str]:
    name, arguments, call_id = _strs(value)  # (name, arguments JSON, id)
    return name, arguments, call_id


def _check_messages(messages: Any) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, not {type(m).__name__}")
        if not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] has no 'role' string")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise TypeError(f"messages[{i}]['content'] must be a string or a list of parts")
