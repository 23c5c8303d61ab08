"""OpenAI's Responses API (``POST /v1/responses``, ``/responses``) as llama-server
speaks it: the input items become a chat request, the reply becomes a response
object (a message and function calls) and its stream the ``response.*`` events.
Stateless: ``previous_response_id`` is refused (nothing is stored)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict

from .base import BadRequest, ServerRequest, Unsupported
from .requests import ChatRequest, check_conversation, tools_bytes

if TYPE_CHECKING:
    from ..llama import Llama

__all__ = ["ResponsesRequest"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            out.append(part.get("text", ""))
        else:
            raise Unsupported(f"multimodal input is not supported (a '{kind}' part)", "input")
    return "".join(out)


class ResponsesRequest(ServerRequest):
    """``POST /v1/responses``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    return_progress: bool = False  # llama-server's: prompt_progress on response.in_progress events
    timings_per_token: bool = False  # llama-server's: each text delta event carries the timings so far
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    previous_response_id: str | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None

    sse_event_names: ClassVar[bool] = True
    filled: ClassVar[tuple[str, ...] | None] = ("temperature", "top_p")
    api: ClassVar[str] = "responses"
    # llama-server's own fields pass through (the declaration's "responses" names)
    model_config = ConfigDict(extra="allow")

    def budget_given(self) -> tuple[str, int] | None:
        return None if self.max_output_tokens is None else ("max_output_tokens", self.max_output_tokens)

    def prompt_bytes(self) -> int:
        """The input's JSON, instructions and tools in bytes, after the conversation's
        bounds (BadRequest)."""
        check_conversation([] if isinstance(self.input, str) else self.input, self.tools, "input")
        return len(json.dumps(self.input)) + len(self.instructions or "") + tools_bytes(self.tools)

    def check(self, n_vocab: int, parallel: int) -> None:
        self.check_common(parallel)
        if self.previous_response_id:
            raise BadRequest("previous_response_id is not supported (responses are not stored)", "previous_response_id")

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for item in self.input:
            kind = item.get("type", "message")
            if kind == "message":
                role = {"developer": "system"}.get(item.get("role", "user"), item.get("role", "user"))
                out.append({"role": role, "content": _text(item.get("content"))})
            elif kind == "function_call":
                call = {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
                }
                if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                out.append(
                    {"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output", ""))}
                )
            elif kind == "reasoning":
                continue
            else:
                raise BadRequest(f"input items of type {kind!r} are not supported", "input")
        return out

    def chat(self) -> ChatRequest:
        tools = None
        if self.tools:
            tools = []
            for t in self.tools:
                if t.get("type") != "function":
                    raise BadRequest(f"tools of type {t.get('type')!r} are not supported (only functions)", "tools")
                tools.append(
                    {
                        "type": "function",
                        "function": {
                            "name": t.get("name"),
                            "description": t.get("description", ""),
                            "parameters": t.get("parameters", {}),
                        },
                    }
                )
        fields: dict[str, Any] = {
            **self.chat_options(),
            "messages": self.messages(),
            "max_tokens": self.max_output_tokens,
            "stream": self.stream,
            "tools": tools,
            "tool_choice": self.tool_choice,
            "return_progress": self.return_progress or None,
            "timings_per_token": self.timings_per_token or None,
        }
        req = ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        req.fill(self.chat_defaults())
        return req

    def respond(self, llm: Llama, model: str, cancel: Callable[[], bool]) -> Any:
        chat = self.chat()
        chat.check(llm.n_vocab(), llm.n_parallel)
        out = chat.respond(llm, model, cancel)
        head = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
            "tools": self.tools or [],
            "tool_choice": self.tool_choice or "auto",
            "parallel_tool_calls": True,
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "metadata": {},
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_output_tokens": self.max_output_tokens,
        }
        if self.stream:
            return _events(out, head)
        choice = out["choices"][0]
        message = choice["message"]
        return _response(
            head,
            message.get("content") or "",
            message.get("tool_calls") or [],
            out["usage"],
            choice["finish_reason"],
            out["timings"],
        )


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else [],
    }


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def _response(
    head: dict[str, Any],
    text: str,
    calls: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    finish: str | None,
    timings: Any,
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if text or not calls:
        output.append(_message_item(f"msg_{uuid.uuid4().hex}", text))
    output += [_call_item(c) for c in calls]
    u = usage or {}
    return {
        **head,
        "status": "incomplete" if finish == "length" else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "output": output,
        "output_text": text,
        "usage": {
            "input_tokens": u.get("prompt_tokens", 0),
            "output_tokens": u.get("completion_tokens", 0),
            "total_tokens": u.get("total_tokens", 0),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "timings": timings,
    }


def _events(chunks: Iterator[dict[str, Any]], head: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The ``response.*`` events of an OpenAI chat stream."""
    seq = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return {"type": kind, "sequence_number": seq - 1, **fields}

    msg_id = f"msg_{uuid.uuid4().hex}"
    text = ""
    calls: list[dict[str, Any]] = []
    opened = False
    started = False
    try:
        for chunk in chunks:
            progress = {"prompt_progress": chunk["prompt_progress"]} if "prompt_progress" in chunk else {}
            if not started:
                started = True
                pending = {**head, "status": "in_progress", "output": [], "usage": None}
                yield event("response.created", response=pending)
                yield event("response.in_progress", response=pending, **progress)
            elif progress:  # llama-server's: one response.in_progress per prompt chunk
                yield event("response.in_progress", response=pending, **progress)
            if progress:
                continue
            choice = chunk["choices"][0]
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if not opened:
                    opened = True
                    yield event(
                        "response.output_item.added", output_index=0, item=_message_item(msg_id, "", "in_progress")
                    )
                    yield event(
                        "response.content_part.added",
                        item_id=msg_id,
                        output_index=0,
                        content_index=0,
                        part={"type": "output_text", "text": "", "annotations": []},
                    )
                text += delta["content"]
                timed = {"timings": chunk["timings"]} if "timings" in chunk else {}
                yield event(
                    "response.output_text.delta",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    delta=delta["content"],
                    logprobs=[],
                    **timed,
                )
            calls += delta.get("tool_calls") or []  # they come whole, before the last chunk
            if choice.get("finish_reason") is not None:
                done = _response(head, text, calls, chunk.get("usage"), choice["finish_reason"], chunk.get("timings"))
                yield from _closing(event, done, msg_id, text if opened else None)
    finally:
        chunks.close()  # type: ignore[attr-defined]


def _closing(
    event: Callable[..., dict[str, Any]], done: dict[str, Any], msg_id: str, text: str | None
) -> Iterator[dict[str, Any]]:
    """The events that close a response: its text part's (``text`` None: it had none),
    each tool call's, and the last one."""
    if text is not None:
        part = {"type": "output_text", "text": text, "annotations": []}
        yield event(
            "response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=text, logprobs=[]
        )
        yield event("response.content_part.done", item_id=msg_id, output_index=0, content_index=0, part=part)
        yield event("response.output_item.done", output_index=0, item=_message_item(msg_id, text))
    first = 0 if text is None else 1
    for i, item in enumerate(x for x in done["output"] if x["type"] == "function_call"):
        yield event("response.output_item.added", output_index=first + i, item=item)
        yield event(
            "response.function_call_arguments.done",
            item_id=item["id"],
            output_index=first + i,
            arguments=item["arguments"],
        )
        yield event("response.output_item.done", output_index=first + i, item=item)
    if text is not None:
        done["output"][0]["id"] = msg_id
    # llama-server's stream always ends with response.completed (the response's status says
    # incomplete), its timings beside the response
    yield event("response.completed", response=done, timings=done["timings"])
