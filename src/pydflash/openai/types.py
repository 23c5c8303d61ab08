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

from ..results import CompletionUsage, DraftSourceTimings, SpeculativeStats, Timings  # (re-exported too)

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
    "ChunkSpeculative",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionUsage",
    "FinishReasonOAI",
    "SpeculativePass",
    "SpeculativeStats",
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
    """A tool offered to the model (OpenAI's ``tools`` entry): ``type`` and ``function``."""

    type: Literal["function"]
    function: dict[str, Any]


class CompletionLogprobs(TypedDict):
    """The completions API's ``logprobs``: parallel lists, one entry per token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]  # characters of text before each token


class CompletionChoice(TypedDict):
    """One choice of a ``Completion``: its text, index, logprobs and finish reason."""

    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReasonOAI | None


class Completion(TypedDict):
    """What ``create_completion`` returns (OpenAI's ``text_completion`` object, with llama-server's ``timings``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    timings: Timings
    speculative: SpeculativeStats


class PromptProgressJSON(TypedDict):
    """llama-server's ``prompt_progress`` (``return_progress``): see ``PromptProgress``."""

    total: int
    cache: int
    processed: int
    time_ms: int


class SpeculativePass(TypedDict):
    """One target verification pass, in a stream chunk's ``ChunkSpeculative``."""

    n_drafted: int  # tokens drafted for it
    n_accepted: int  # of those, kept: the pass added n_accepted + 1 tokens (its own last)
    draft_max: int  # the draft length asked for (the policy's choice, or a pinned one; 0: none)
    source: str  # who drafted: "draft-dflash", "ngram-mod", ...; "": nobody


class ChunkSpeculative(TypedDict):
    """A stream chunk's ``speculative`` with ``timings_per_token``: how this chunk's tokens
    were made. ``tokens``: the text of each token the chunk completes (a character split
    over tokens counts for the one that completes it); ``kinds``: one letter per token,
    "d" drafted and accepted, "t" the target's own (the last token of its pass);
    ``passes``: the target passes finished since the previous chunk. The last chunk
    adds ``SpeculativeStats``' fields."""

    tokens: list[str]
    kinds: str
    passes: list[SpeculativePass]
    accepted_lengths: NotRequired[list[int]]  # the last chunk
    draft_sources: NotRequired[dict[str, DraftSourceTimings]]  # the last chunk


class CompletionChunk(TypedDict):
    """One streamed piece of a completion; the last one carries ``usage`` and ``timings``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: NotRequired[CompletionUsage]  # last chunk only
    timings: NotRequired[Timings]  # the last chunk; every chunk with timings_per_token
    speculative: NotRequired[SpeculativeStats | ChunkSpeculative]  # as timings (ChunkSpeculative: per chunk)
    prompt_progress: NotRequired[PromptProgressJSON]  # return_progress's events, before any text


class ChatCompletionToolCallFunction(TypedDict):
    name: str
    arguments: str


class ChatCompletionToolCall(TypedDict):
    """A tool call the model made, parsed by the template's reply format."""

    id: str
    type: Literal["function"]
    function: ChatCompletionToolCallFunction


class ChatCompletionMessage(TypedDict):
    """The assistant's message: content, reasoning content and tool calls."""

    role: Literal["assistant"]
    content: str | None
    reasoning_content: NotRequired[str]  # only when the template separates reasoning
    tool_calls: NotRequired[list[ChatCompletionToolCall]]


class ChatTopLogprob(TypedDict):
    """One of the most likely tokens at a position (chat logprobs)."""

    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TypedDict):
    """A generated token's log-probability and the most likely alternatives (chat logprobs)."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(TypedDict):
    """The chat API's ``logprobs``: one ``content`` entry per generated token."""

    content: list[ChatTokenLogprob]


class ChatCompletionChoice(TypedDict):
    """One choice of a ``ChatCompletion``: its message, index, logprobs and finish reason."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOAI | None


class ChatCompletion(TypedDict):
    """What ``create_chat_completion`` returns (OpenAI's ``chat.completion`` object, with
    llama-server's ``timings``)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: CompletionUsage
    timings: Timings
    speculative: SpeculativeStats


class ChatCompletionChunkDelta(TypedDict, total=False):
    """What a streamed chat chunk adds to the message."""

    role: Literal["assistant"]
    content: str | None  # absent from the first chunk (the role alone, as llama-cpp-python); the server sends None
    reasoning_content: str
    tool_calls: list[dict[str, Any]]


class ChatCompletionChunkChoice(TypedDict):
    """One choice of a ``ChatCompletionChunk``."""

    index: int
    delta: ChatCompletionChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReasonOAI | None


class ChatCompletionChunk(TypedDict):
    """One streamed piece of a chat completion; the last one carries ``usage`` and ``timings``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: NotRequired[CompletionUsage]  # last chunk only
    timings: NotRequired[Timings]  # the last chunk; every chunk with timings_per_token
    speculative: NotRequired[SpeculativeStats | ChunkSpeculative]  # as timings (ChunkSpeculative: per chunk)
    prompt_progress: NotRequired[PromptProgressJSON]  # return_progress's events, before any text
