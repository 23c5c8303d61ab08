"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``)
as llama-server speaks it: the request becomes an OpenAI chat request (system
prompt, text and tool blocks, tool results), the reply and its stream become
Anthropic's message and events (``message_start`` ... ``message_stop``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from ..openai.completions import chat_prompt_tokens
from .base import BadRequest, NoVision, ServerRequest, Unsupported
from .requests import ChatRequest, check_conversation, tools_bytes

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = ["AnthropicRequest", "CountTokensRequest"]

_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def _has_image(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "image" for b in content)


class _Messages(BaseModel):
    """What both endpoints read: the conversation, the system prompt, the tools."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None

    def bounded_bytes(self) -> int:
        """The prompt's text in bytes (messages, system, tools: a lower bound of the rendered
        prompt's), after the conversation's bounds (BadRequest)."""
        check_conversation(self.messages, self.tools)
        text = sum(
            len(m.get("content", "") if isinstance(m.get("content"), str) else json.dumps(m.get("content")))
            for m in self.messages
        )
        return text + len(_text(self.system or "")) + tools_bytes(self.tools)

    def openai_messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": _text(self.system)})
        for m in self.messages:
            role, content = m.get("role"), m.get("content")
            if role not in ("user", "assistant"):
                raise BadRequest("a message's role must be user or assistant", "messages")
            if isinstance(content, str):
                out.append({"role": role, "content": content})
                continue
            if not isinstance(content, list):
                raise BadRequest("a message's content must be a string or a list of blocks", "messages")
            text: list[str] = []
            calls: list[dict[str, Any]] = []
            for block in content:
                kind = block.get("type") if isinstance(block, dict) else None
                if kind == "text":
                    text.append(block.get("text", ""))
                elif kind == "tool_use":
                    args = json.dumps(block.get("input", {}))
                    calls.append(
                        {
                            "id": block.get("id"),
                            "type": "function",
                            "function": {"name": block.get("name"), "arguments": args},
                        }
                    )
                elif kind == "image" or (kind == "tool_result" and _has_image(block.get("content"))):
                    raise NoVision("messages")  # llama-server's answer: this model reads no images
                elif kind == "tool_result":
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block.get("tool_use_id"),
                            "content": _text(block.get("content")),
                        }
                    )
                elif kind in ("thinking", "redacted_thinking"):
                    continue  # earlier reasoning is not sent back to the template
                else:
                    raise Unsupported(f"multimodal input is not supported (a '{kind}' block)", "messages")
            if text or calls:
                msg: dict[str, Any] = {"role": role, "content": "".join(text)}
                if calls:
                    msg["tool_calls"] = calls
                out.append(msg)
        return out

    def openai_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        return [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema", {}),
                },
            }
            for t in self.tools
        ]

    def openai_tool_choice(self) -> str | dict[str, Any] | None:
        """Anthropic's ``tool_choice`` in OpenAI's words: "any" is "required", a named tool
        that function alone (llama-server reads both as "required")."""
        choice = self.tool_choice or {}
        kind = choice.get("type")
        if kind in (None, "auto"):
            return None
        if kind in ("none", "any"):
            return "none" if kind == "none" else "required"
        if kind == "tool" and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        raise BadRequest(f"tool_choice {kind!r} is not supported (supported: auto, any, tool, none)", "tool_choice")


class AnthropicRequest(_Messages, ServerRequest):
    """``POST /v1/messages``."""

    max_tokens: int = 4096  # required by Anthropic's API; llama-server's default when absent
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop_sequences: list[str] | None = None
    thinking: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None  # llama-server passes its own fields through
    seed: int | None = None

    sse_event_names: ClassVar[bool] = True  # "event: message_start" lines, as Anthropic's streams have
    keep_timings: ClassVar[bool] = False  # counted in /metrics, not shown: llama-server's replies have none
    stop_field: ClassVar[str] = "stop_sequences"
    filled: ClassVar[tuple[str, ...] | None] = ("temperature", "top_p", "top_k")
    api: ClassVar[str] = "anthropic"
    # llama-server's own fields pass through (the declaration's "anthropic" names)
    model_config = ConfigDict(extra="allow")

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def budget_given(self) -> tuple[str, int] | None:
        return "max_tokens", self.max_tokens

    def prompt_bytes(self) -> int:
        return self.bounded_bytes()

    def check(self, n_vocab: int, parallel: int) -> None:
        self.check_common(parallel)
        self.openai_tool_choice()

    def chat(self) -> ChatRequest:
        fields: dict[str, Any] = {
            **self.chat_options(),
            "messages": self.openai_messages(),
            "max_tokens": self.max_tokens,
            "stream": self.stream,
            "tools": self.openai_tools(),
            "tool_choice": self.openai_tool_choice(),
            # message_start's usage is the prompt's, known once the first text comes
            "timings_per_token": self.stream or None,
        }
        if self.thinking is not None:
            fields["enable_thinking"] = self.thinking.get("type") == "enabled"
        req = ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        req.fill(self.chat_defaults())
        return req

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        out = self.chat().respond(llm, model, cancel)
        msg_id = f"msg_{uuid.uuid4().hex}"
        if self.stream:
            return _events(out, msg_id, model)
        choice = out["choices"][0]
        message = choice["message"]
        content: list[dict[str, Any]] = []
        if message.get("reasoning_content"):
            content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            content.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"] or "{}"),
                }
            )
        return {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": _STOP_REASON.get(choice["finish_reason"], "end_turn"),
            "stop_sequence": None,
            "usage": {
                "input_tokens": out["usage"]["prompt_tokens"],
                "output_tokens": out["usage"]["completion_tokens"],
                "cache_read_input_tokens": out["timings"]["cache_n"],
            },
            "timings": out["timings"],
            "speculative": out["speculative"],  # for /metrics; dropped with the timings
        }


def _message_start(msg_id: str, model: str, timings: dict[str, Any]) -> dict[str, Any]:
    # llama-server's: the prompt tokens evaluated (prompt_n) apart from those read from the cache
    usage = {"cache_read_input_tokens": timings["cache_n"], "input_tokens": timings["prompt_n"], "output_tokens": 0}
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        },
    }


def _events(chunks: Iterator[dict[str, Any]], msg_id: str, model: str) -> Iterator[dict[str, Any]]:
    """Anthropic's stream events from an OpenAI chat stream."""
    index = -1
    open_kind: str | None = None  # the kind of the content block now open

    def close() -> Iterator[dict[str, Any]]:
        nonlocal open_kind
        if open_kind is not None:
            open_kind = None
            yield {"type": "content_block_stop", "index": index}

    def start(kind: str, block: dict[str, Any]) -> Iterator[dict[str, Any]]:
        nonlocal index, open_kind
        yield from close()
        index += 1
        open_kind = kind
        yield {"type": "content_block_start", "index": index, "content_block": block}

    started = False
    try:
        for chunk in chunks:
            # with the first chunk of text (or the last chunk): each has the timings so far
            if not started and "timings" in chunk:
                started = True
                yield _message_start(msg_id, model, chunk["timings"])
            choice = chunk["choices"][0]
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if open_kind != "thinking":
                    yield from start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                yield {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "thinking_delta", "thinking": delta["reasoning_content"]},
                }
            if delta.get("content"):
                if open_kind != "text":
                    yield from start("text", {"type": "text", "text": ""})
                yield {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": delta["content"]},
                }
            for call in delta.get("tool_calls") or []:
                yield from start(
                    "tool_use", {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}
                )
                yield {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": call["function"]["arguments"]},
                }
            if choice.get("finish_reason") is not None:
                yield from close()
                usage = chunk.get("usage") or {}
                yield {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": _STOP_REASON.get(choice["finish_reason"], "end_turn"),
                        "stop_sequence": None,
                    },
                    "usage": {
                        "input_tokens": usage.get("prompt_tokens", 0),
                        "output_tokens": usage.get("completion_tokens", 0),
                        "cache_read_input_tokens": (chunk.get("timings") or {}).get("cache_n", 0),
                    },
                    "timings": chunk.get("timings"),
                    "speculative": chunk.get("speculative"),
                }
                yield {"type": "message_stop"}
    finally:
        chunks.close()  # type: ignore[attr-defined]  # a generator: leaving early ends the generation


class CountTokensRequest(_Messages):
    """``POST /v1/messages/count_tokens``: the prompt's tokens, nothing generated."""

    def count(self, llm: Llama, limit: Callable[[int], None]) -> dict[str, Any]:
        """The prompt's tokens; ``limit``: the server's prompt limit, asked before any work."""
        limit(self.bounded_bytes())
        tools = self.openai_tools()
        prompt = llm.apply_chat_template(self.openai_messages(), tools=tools)
        return {"input_tokens": len(chat_prompt_tokens(llm, prompt))}
