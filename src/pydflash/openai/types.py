"""OpenAI-shaped result types of ``create_completion`` / ``create_chat_completion``
(and of ``pydflash serve``), as ``TypedDict``s: plain dicts at run time, so they
serialise to JSON as they are. ``timings`` follows llama-server's object
(``draft_n`` / ``draft_n_accepted`` included) plus DFlash's own numbers."""

from __future__ import annotations

import sys
from typing import Any, Literal

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # pragma: no cover - 3.10
    from typing_extensions import NotRequired, TypedDict

from ..results import CompletionUsage, DraftSourceTimings, Timings  # noqa: F401  (re-exported: part of the OpenAI-shaped types)

__all__ = [
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatCompletionChunkDelta",
    "ChatCompletionMessage",
    "ChatCompletionMessageParam",
    "ChatCompletionTool",
    "ChatCompletionToolCall",
    "ChatLogprobs",
    "ChatTokenLogprob",
    "ChatTopLogprob",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionUsage",
    "FinishReasonOAI",
    "Timings",
]

FinishReasonOAI = Literal["stop", "length", "tool_calls"]


class ChatCompletionMessageParam(TypedDict, total=False):
    """One input message: ``{"role": "user", "content": "..."}`` (content may also
    be a list of ``{"type": "text", "text": ...}`` parts)."""

    role: str
    content: str | list[dict[str, Any]] | None
    name: str
    reasoning_content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str


class ChatCompletionTool(TypedDict):
    type: Literal["function"]
    function: dict[str, Any]


class CompletionLogprobs(TypedDict):
    """The completions API's ``logprobs``: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]  # characters of text before each token


class CompletionChoice(TypedDict):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonOAI | None


class Completion(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    timings: Timings


class CompletionChunk(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: NotRequired[CompletionUsage]  # last chunk only
    timings: NotRequired[Timings]  # last chunk only


class ChatCompletionToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: ChatCompletionToolCallFunction


class ChatCompletionMessage(TypedDict):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: NotRequired[str]  # only when the template separates reasoning
    tool_calls: NotRequired[list[ChatCompletionToolCall]]


class ChatTopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(TypedDict):
    """The chat API's ``logprobs``: one ``content`` entry per generated token."""

    content: list[ChatTokenLogprob]


class ChatCompletionChoice(TypedDict):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOAI | None


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage
    timings: Timings


class ChatCompletionChunkDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None  # None in the first chunk, as llama-server and OpenAI send it
    reasoning_content: str
    tool_calls: list[dict[str, Any]]


class ChatCompletionChunkChoice(TypedDict):
    index: int
    delta: ChatCompletionChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOAI | None


class ChatCompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: NotRequired[CompletionUsage]  # last chunk only
    timings: NotRequired[Timings]  # last chunk only
