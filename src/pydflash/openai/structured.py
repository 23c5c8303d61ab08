"""Structured output for the OpenAI-shaped API: ``response_format`` (OpenAI's
``json_object``/``json_schema``, read as llama-server reads it), ``json_schema`` and
``grammar`` (llama-server's fields), and the grammar a chat template builds from them
and from ``tools``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import Grammar
from .chat import ChatPrompt

__all__ = ["Constraint", "chat_grammar", "constraint"]

#: (JSON schema, GBNF): at most one is set
Constraint = tuple[Mapping[str, Any] | None, str | None]


def _schema_of(response_format: Mapping[str, Any]) -> Mapping[str, Any] | None:
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema", {})  # llama-server also takes a schema here
    elif kind == "json_schema":
        wrapper = response_format.get("json_schema", {})
        if not isinstance(wrapper, Mapping):
            raise ValueError("response_format.json_schema must be an object")
        schema = wrapper.get("schema", {})
    else:
        raise ValueError(f'response_format type must be "text", "json_object" or "json_schema", got {kind!r}')
    if not isinstance(schema, Mapping):
        raise ValueError("a JSON schema must be an object")
    return schema


def constraint(
    response_format: Mapping[str, Any] | None,
    json_schema: Mapping[str, Any] | None,
    grammar: str | Grammar | None,
) -> Constraint:
    """The one constraint the options ask for (ValueError when they ask for two); a
    ``Grammar`` (``LlamaGrammar``) stands for its GBNF text."""
    if response_format is not None and not isinstance(response_format, Mapping):
        raise ValueError("response_format must be an object")
    schema = _schema_of(response_format) if response_format is not None else None
    if schema is not None and json_schema is not None:
        raise ValueError("give response_format or json_schema, not both")
    schema = schema if schema is not None else json_schema
    if schema is not None and not isinstance(schema, Mapping):
        raise ValueError("json_schema must be an object")
    if schema is not None and grammar is not None:
        raise ValueError("give a JSON schema (response_format, json_schema) or grammar, not both")
    if isinstance(grammar, Grammar):
        if grammar.lazy or grammar.prefill:
            raise ValueError("a lazy or prefilled Grammar applies to generate() only; give its GBNF text here")
        grammar = grammar.gbnf
    if grammar is not None and not isinstance(grammar, str):
        raise TypeError(f"grammar must be GBNF text or a Grammar, not {type(grammar).__name__}")
    return schema, grammar


def chat_grammar(cp: ChatPrompt, c: Constraint, tokenize: Callable[[str], Sequence[int]]) -> Grammar | None:
    """The reply's grammar: the template's (which frames a schema in its own format, and
    constrains tool calls once they start), else the user's grammar or the schema's own
    (as llama-server falls back to the request's)."""
    schema, gbnf = c
    if cp.grammar:
        prefill: tuple[int, ...] = ()
        if not cp.grammar_lazy and cp.generation_prompt:
            # the assistant prefix the template appended is already in the prompt: the
            # grammar reads past it first (as llama.cpp's sampler does)
            prefill = tuple(tokenize(cp.generation_prompt))
        return Grammar(
            cp.grammar,
            lazy=cp.grammar_lazy,
            trigger_patterns=cp.grammar_trigger_patterns,
            trigger_tokens=cp.grammar_trigger_tokens,
            prefill=prefill,
        )
    if gbnf is not None:
        return Grammar(gbnf)
    return Grammar.from_json_schema(schema) if schema is not None else None
