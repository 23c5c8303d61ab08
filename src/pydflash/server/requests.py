"""The server's request bodies as pydantic models: strict JSON types (``"false"``
is not a bool, ``1.5`` not an int), OpenAI's fields plus llama-server's, and the
keyword arguments of ``create_completion`` / ``create_chat_completion`` they
make. Values are checked where they are used (the core's option rules); only
what the library does not check is checked here."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import ConfigDict, ValidationError, create_model

from .._core import __version__
from ..openai.chat import resolve_tool_choice
from ..openai.completions import MAX_CHOICES, chat_prompt
from .base import BadRequest, LlamaFields, Unsupported, must_be, option_fields, plain_options

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = [
    "MAX_MESSAGES",
    "MAX_PROBS",
    "MAX_PROMPTS",
    "MAX_TOOLS",
    "ChatRequest",
    "CompletionRequest",
    "check_conversation",
    "check_probs",
    "describe",
    "tools_bytes",
]

Prompt = Annotated[
    str | list[int] | list[str] | list[list[int]],
    must_be("a string, a list of token ids, or a list of one of these"),
]

FINGERPRINT = f"b{__version__}-pydflash"

# What else one request may ask for, checked before any work (a template rendered over
# 290,000 messages took 72 s before the prompt limit could refuse it; 4,096 top tokens per
# token made a 64 MB reply). The prompt limit (limits.py) also counts the tools' JSON.
MAX_PROBS = 20  # n_probs / logprobs / top_logprobs: OpenAI's cap on top_logprobs
MAX_MESSAGES = 4096  # messages (or Responses input items) of one conversation
MAX_TOOLS = 128  # tools offered in one request: OpenAI's cap
MAX_PROMPTS = 16  # prompts of one native /completion


def check_probs(field: str, n: int | None) -> None:
    """BadRequest when ``n`` top tokens per token are over MAX_PROBS."""
    if n is not None and not isinstance(n, bool) and n > MAX_PROBS:
        raise BadRequest(f"'{field}' must be at most {MAX_PROBS}, got {n}", field)


def check_conversation(messages: Sequence[object], tools: Sequence[object] | None, param: str = "messages") -> None:
    """BadRequest when a conversation holds over MAX_MESSAGES messages, one that is not an
    object, or over MAX_TOOLS tools."""
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"'{param}' may hold at most {MAX_MESSAGES} messages, got {len(messages)}", param)
    if not all(isinstance(m, dict) for m in messages):
        raise BadRequest(f"each of '{param}' must be an object", param)
    if tools is not None and len(tools) > MAX_TOOLS:
        raise BadRequest(f"'tools' may hold at most {MAX_TOOLS} tools, got {len(tools)}", "tools")


def tools_bytes(tools: object) -> int:
    """The tools' JSON in bytes: the template writes them into the prompt."""
    return len(json.dumps(tools, ensure_ascii=False).encode("utf-8", "surrogatepass")) if tools else 0


# the options the declaration (options.py) gives the chat endpoint are fields made from it (the
# completions' names are the same), passed on under the library's names when given (None: the
# library's default); but those each kind reads itself (the token budget, the log-probabilities)
_OWN = ("max_tokens", "logprobs", "top_logprobs")
_OPTIONS = plain_options("chat", _OWN)  # the stop strings too (LlamaFields' field)
_PASSED = ("id_slot", "n", "response_format", "return_progress", "timings_per_token")

if TYPE_CHECKING:
    _Options = LlamaFields
else:
    _Options = create_model(
        "_Options",
        __base__=LlamaFields,
        __module__=__name__,
        **option_fields("chat", (*_OWN, *LlamaFields.model_fields)),
    )


class _Request(_Options):
    """The fields completions and chat share. Unknown fields are ignored (OpenAI's
    clients send ``user``, ``stream_options`` ...)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    stream: bool | None = None  # null: a field's default, as OpenAI's API reads it
    n: int | None = None
    response_format: dict[str, Any] | None = None
    return_progress: bool | None = None  # llama-server's: prompt_progress events in a stream
    timings_per_token: bool | None = None  # llama-server's: each chunk of a stream with its timings
    stream_options: dict[str, Any] | None = None  # OpenAI's: include_usage
    verbose: bool | None = None  # llama-server's: the reply with its native view in "__verbose"

    done_marker: ClassVar[bool] = True  # OpenAI's streams end with "data: [DONE]"

    def arguments(self) -> tuple[Any, dict[str, Any]]:
        """(prompt or messages, keyword arguments) of the completion function."""
        raise NotImplementedError

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        """The response, or a stream's chunks."""
        first, kw = self.arguments()
        if kw.get("penalty_last_n") == -1:  # llama-server's -1: the whole context (of a slot)
            kw["penalty_last_n"] = llm.n_ctx_slot
        create: Callable[..., Any] = (
            llm.create_completion if isinstance(self, CompletionRequest) else llm.create_chat_completion
        )
        # the prompt is tokenized (and a chat template applied) here, in the worker's thread
        out = create(first, stream=bool(self.stream), model=model, cancel=cancel, **kw)
        if not self.stream:
            out["system_fingerprint"] = FINGERPRINT
            if self.verbose:
                out["__verbose"] = self._verbose(llm, out)
            return out
        chunks = _fingerprinted(out)
        return _usage_apart(chunks) if (self.stream_options or {}).get("include_usage") else chunks

    def _verbose(self, llm: Llama, out: dict[str, Any]) -> dict[str, Any]:
        """llama-server's ``__verbose``: the reply as its native completion shows it (the
        fields the OpenAI reply holds, and the prompt as the model read it)."""
        choice, usage = out["choices"][0], out["usage"]
        content = choice["text"] if "text" in choice else choice["message"].get("content") or ""
        first, kw = self.arguments()
        prompt = first if isinstance(self, CompletionRequest) else chat_prompt(llm, first, **kw)
        return {
            "index": 0,
            "content": content,
            "model": out["model"],
            "prompt": llm.detokenize(llm.prompt_tokens(prompt), special=True).decode("utf-8", "replace"),
            "stop": True,
            "has_new_line": "\n" in content,
            "tokens_predicted": usage["completion_tokens"],
            "tokens_evaluated": usage["prompt_tokens"],
            "tokens_cached": usage["total_tokens"],
            "timings": out["timings"],
        }

    def check(self, n_vocab: int, parallel: int) -> None:
        if self.n is not None and not 1 <= self.n <= MAX_CHOICES:
            raise BadRequest(f"'n' must be in [1, {MAX_CHOICES}]", "n")
        self.check_common(parallel)
        last_n = self.given("repeat_last_n")
        if last_n is not None and last_n < -1:
            raise BadRequest(f"'repeat_last_n' must be -1 (the context) or >= 0, got {last_n}", "repeat_last_n")
        for key in self.given("logit_bias") or {}:  # here, so that a stream fails before it starts
            if not (key.lstrip("-").isdigit() and 0 <= int(key) < n_vocab):
                raise BadRequest(f"logit_bias keys must be token ids in [0, {n_vocab}), got {key!r}", "logit_bias")

    def options(self) -> dict[str, Any]:
        """The keyword arguments common to both completion functions."""
        kw = {k: v for k in _PASSED if (v := getattr(self, k)) is not None}
        kw.update({name: v for name, wire in _OPTIONS.items() if (v := self.given(wire)) is not None})
        kw["max_tokens"] = self.token_budget()
        return kw


class CompletionRequest(_Request):
    """``POST /v1/completions``."""

    prompt: Prompt
    suffix: str | None = None
    echo: bool | None = None
    logprobs: int | None = None
    n_probs: int | None = None  # llama-server's name for logprobs

    @property
    def lead(self) -> int:
        return 2 if self.echo else 1  # echo's prompt chunk comes before any decoding

    def prompt_bytes(self) -> int:
        p = self.prompt
        texts = [p] if isinstance(p, str) else [x for x in p if isinstance(x, str)]
        return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)

    def check(self, n_vocab: int, parallel: int) -> None:
        super().check(n_vocab, parallel)
        if self.logprobs is not None:  # the field arguments() reads
            check_probs("logprobs", self.logprobs)
        else:
            check_probs("n_probs", self.n_probs)
        if self.suffix:
            raise BadRequest("'suffix' is not supported", "suffix")
        if self._batch() and len(self.prompt) != 1:
            raise BadRequest("one prompt per request ('prompt' lists of several are not supported)", "prompt")

    def _batch(self) -> bool:
        """Whether ``prompt`` is a list of prompts (OpenAI's batch form)."""
        return isinstance(self.prompt, list) and bool(self.prompt) and not isinstance(self.prompt[0], int)

    def arguments(self) -> tuple[str | Sequence[int], dict[str, Any]]:
        """(prompt, keyword arguments) of ``create_completion``."""
        prompt: Any = self.prompt[0] if self._batch() else self.prompt  # a batch of one
        kw = self.options()
        kw["echo"] = bool(self.echo)
        n = self.logprobs if self.logprobs is not None else self.n_probs
        if n is not None:
            kw["logprobs"] = n
        return prompt, kw


class ChatRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    enable_thinking: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    timings_per_token: bool | None = None  # llama-server's: a stream's text chunks carry timings

    def prompt_bytes(self) -> int:
        # the messages' text and the tools (the template adds to them): a lower bound on the prompt's
        text = sum(len(_text_of(m.get("content")).encode("utf-8", "surrogatepass")) for m in self.messages)
        return text + tools_bytes(self.tools)

    def check(self, n_vocab: int, parallel: int) -> None:
        super().check(n_vocab, parallel)
        check_conversation(self.messages, self.tools)
        check_probs("top_logprobs", self.top_logprobs)
        for m in self.messages:
            parts = m.get("content")
            for part in parts if isinstance(parts, list) else []:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in (None, "text"):
                    raise Unsupported(f"multimodal input is not supported (a '{kind}' content part)", "messages")
        roles = [m.get("role") for m in self.messages[-2:]]
        if self.continue_final_message is None and roles == ["assistant", "assistant"]:
            # llama-server continues a final assistant message (its prefill): two are ambiguous
            raise BadRequest("Cannot have 2 or more assistant messages at the end of the list.", "messages")
        if self.continue_final_message and self.add_generation_prompt is not False:
            # llama-server's rule: add_generation_prompt is true unless the request says false
            raise BadRequest(
                "Cannot set both add_generation_prompt and continue_final_message to true.", "continue_final_message"
            )
        try:  # "auto", "none", "required" or a named function (create_chat_completion reads it)
            resolve_tool_choice(self.tools, self.tool_choice)
        except (TypeError, ValueError) as e:
            raise BadRequest(f"tool_choice {json.dumps(self.tool_choice)}: {e}", "tool_choice") from None

    def arguments(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """(messages, keyword arguments) of ``create_chat_completion``."""
        kw = self.options()
        kw["tools"] = self.tools  # with "none" too: llama-server's template shows them
        kw["tool_choice"] = self.tool_choice
        kw["chat_template_kwargs"] = self.chat_template_kwargs
        if self.add_generation_prompt is not None:
            kw["chat_template_kwargs"] = {
                **(self.chat_template_kwargs or {}),
                "add_generation_prompt": self.add_generation_prompt,
            }
        if self.enable_thinking is not None:
            kw["enable_thinking"] = self.enable_thinking
        kw["logprobs"] = bool(self.logprobs)
        kw["top_logprobs"] = self.top_logprobs
        if self.timings_per_token and self.stream:
            kw["timings_per_token"] = True
        if not self.jinja:
            kw["template_format"] = False
        return self.messages, kw


def _text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, or OpenAI's list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


_TYPES = {
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "string_type": "str",
    "dict_type": "an object",
    "list_type": "a list",
}


def describe(err: ValidationError) -> BadRequest:
    """A readable 400 from a body's validation errors: "'top_k' must be int"."""
    parts: list[str] = []
    param: str | None = None
    for e in err.errors(include_url=False):
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        if e["type"] == "json_invalid":
            detail = e["msg"].removeprefix("Invalid JSON: ")
            what = "nested too deeply" if "recursion limit" in detail else "not valid JSON"
            if "hex escape" in detail:  # a lone surrogate, which jiter's words do not name
                detail += " (a \\uD800-\\uDFFF escape must be one half of a surrogate pair)"
            return BadRequest(f"request body is {what}: {detail}")
        if not where:
            return BadRequest("request body must be a JSON object")
        param = param or where
        if e["type"] == "missing":
            parts.append(f"'{where}' is required")
        else:
            parts.append(f"'{where}' " + (f"must be {_TYPES[e['type']]}" if e["type"] in _TYPES else e["msg"]))
    return BadRequest("; ".join(parts), param)


def _usage_apart(chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """OpenAI's ``include_usage`` stream, as llama-server sends it: the ``usage`` (and the
    timings) in a chunk of their own after the last, with no choices."""
    try:
        for chunk in chunks:
            if "usage" not in chunk:
                yield chunk
                continue
            tail: dict[str, Any] = {k: chunk.pop(k) for k in ("usage", "timings", "speculative") if k in chunk}
            yield chunk
            head: dict[str, Any] = {
                k: chunk[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in chunk
            }
            yield {**head, "choices": [], **tail}
    finally:
        chunks.close()  # type: ignore[attr-defined]  # a generator: leaving early ends the generation


def _fingerprinted(chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each chunk with ``system_fingerprint`` (OpenAI's field; llama-server's "b<build>-<commit>"),
    and a chat delta that names the role with llama-server's ``"content": null`` beside it."""
    try:
        for chunk in chunks:
            chunk["system_fingerprint"] = FINGERPRINT
            for choice in chunk.get("choices", ()):
                delta = choice.get("delta")
                if delta is not None and "role" in delta:
                    delta.setdefault("content", None)
            yield chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]  # a generator: leaving early ends the generation
