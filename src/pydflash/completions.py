"""``create_completion`` / ``create_chat_completion``: OpenAI-shaped results
(see ``openai_types``) on top of the generation loop (``_generation``), as in
llama-cpp-python, plus llama-server's ``timings`` with DFlash's draft counts.

This module does not import ``llama`` (``Llama`` imports it and delegates
here); it uses ``Llama``'s public members only."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from ._generation import Generation
from .chat import ChatPrompt, ChatReply, ChatTemplate
from .config import SamplingConfig
from .errors import ChatTemplateError
from .openai_types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionChunkDelta,
    ChatCompletionMessage,
    ChatCompletionToolCall,
    Completion,
    CompletionChunk,
    FinishReasonOAI,
)
from .results import FinishReason

if TYPE_CHECKING:  # for the annotations only: llama imports this module
    from .llama import Llama

__all__ = ["create_chat_completion", "create_completion"]

Stop = str | Sequence[str] | None


class _Meta(TypedDict):
    """What every chunk of one response repeats."""

    id: str
    created: int
    model: str


def _finish(reason: FinishReason | None) -> FinishReasonOAI | None:
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


def _stops(stop: Stop, extra: Sequence[str] = ()) -> list[str]:
    if stop is None:
        out: list[str] = []
    elif isinstance(stop, str):
        out = [stop] if stop else []
    else:
        out = [s for s in stop]
        for s in out:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, not {type(s).__name__}")
    for s in extra:
        if s and s not in out:
            out.append(s)
    return out


def _logit_bias(bias: Mapping[Any, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    for k, v in bias.items():
        try:
            out[int(k)] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {k!r}") from None
    return out


def _fill(max_tokens: int | None, n_ctx: int, n_prompt: int) -> int:
    """``max_tokens`` None or <= 0: what the context has left after the prompt."""
    if max_tokens is None or max_tokens <= 0:
        return max(1, n_ctx - n_prompt)
    return max_tokens


def _unsupported(**kw: Any) -> None:
    for name, value in kw.items():
        if value not in (None, False, 0):
            raise ValueError(f"{name} is not supported by pydflash")


# -- completions --------------------------------------------------------------


def create_completion(
    llm: Llama,
    prompt: str | Sequence[int],
    suffix: str | None = None,
    max_tokens: int | None = 16,
    temperature: float = 0.8,
    top_p: float = 0.95,
    min_p: float = 0.05,
    echo: bool = False,
    stop: Stop = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repeat_penalty: float = 1.0,
    top_k: int = 40,
    stream: bool = False,
    seed: int | None = None,
    logit_bias: Mapping[Any, float] | None = None,
    model: str | None = None,
    logprobs: int | None = None,
    *,
    ignore_eos: bool = False,
    draft_max: int | None = None,
    draft_min: int = 0,
    draft_p_min: float = 0.0,
    cache_prompt: bool = True,
    cancel: Callable[[], bool] | None = None,
) -> Completion | Iterator[CompletionChunk]:
    """An OpenAI-style text completion of ``prompt`` (text or token ids).
    Defaults as in llama-cpp-python; ``max_tokens=None`` fills the context.
    ``draft_max``/``draft_min``/``draft_p_min``: as ``Llama.generate``'s.
    ``cancel``: asked after every step; True stops with ``GenerationInterrupted``."""
    _unsupported(suffix=suffix, logprobs=logprobs)
    tokens = llm.prompt_tokens(prompt)
    cfg = SamplingConfig.build(
        max_tokens=_fill(max_tokens, llm.n_ctx, len(tokens)),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        stop=_stops(stop),
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repeat_penalty=repeat_penalty,
        logit_bias=_logit_bias(logit_bias),
        ignore_eos=ignore_eos,
        draft_max=draft_max,
        draft_min=draft_min,
        draft_p_min=draft_p_min,
        cache_prompt=cache_prompt,
    )
    gen = Generation(llm, tokens, cfg)
    meta: _Meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or llm.model_name}
    head = (prompt if isinstance(prompt, str) else llm.detokenize(tokens)) if echo else ""
    if stream:
        return _completion_chunks(gen, cancel, meta, head)
    text = head
    for step in gen.run(cancel):
        text += step.text
    res: Completion = {
        "id": meta["id"],
        "object": "text_completion",
        "created": meta["created"],
        "model": meta["model"],
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": _finish(gen.finish)}],
        "usage": gen.usage(),
        "timings": gen.timings(),
    }
    return res


def _completion_chunks(
    gen: Generation, cancel: Callable[[], bool] | None, meta: _Meta, head: str
) -> Iterator[CompletionChunk]:
    def chunk(text: str, finish: FinishReasonOAI | None) -> CompletionChunk:
        return {
            "id": meta["id"],
            "object": "text_completion",
            "created": meta["created"],
            "model": meta["model"],
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
        }

    it = gen.run(cancel)
    try:
        if head:
            yield chunk(head, None)
        for step in it:
            if step.text:
                yield chunk(step.text, None)
        last = chunk("", _finish(gen.finish))
        last["usage"] = gen.usage()
        last["timings"] = gen.timings()
        yield last
    finally:
        it.close()


# -- chat -----------------------------------------------------------------------


def create_chat_completion(
    llm: Llama,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.2,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    stop: Stop = None,
    seed: int | None = None,
    stream: bool = False,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repeat_penalty: float = 1.0,
    logit_bias: Mapping[Any, float] | None = None,
    model: str | None = None,
    logprobs: bool | None = None,
    *,
    enable_thinking: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    ignore_eos: bool = False,
    draft_max: int | None = None,
    draft_min: int = 0,
    draft_p_min: float = 0.0,
    cache_prompt: bool = True,
    cancel: Callable[[], bool] | None = None,
) -> ChatCompletion | Iterator[ChatCompletionChunk]:
    """An OpenAI-style chat completion: ``messages`` go through the model's chat
    template (or the ``chat_template`` given to ``Llama``). ``enable_thinking=False``
    turns reasoning off where the template has the switch; reasoning the model
    writes comes back in ``message["reasoning_content"]``. Other options as
    ``create_completion``'s."""
    _unsupported(logprobs=logprobs)
    kwargs = dict(chat_template_kwargs or {})
    if "enable_thinking" in kwargs:
        enable_thinking = bool(kwargs.pop("enable_thinking"))
    cp = llm.chat_template.apply(
        messages, add_generation_prompt=True, enable_thinking=enable_thinking, tools=tools, **kwargs
    )
    tokens = llm.prompt_tokens(cp.prompt)
    cfg = SamplingConfig.build(
        max_tokens=_fill(max_tokens, llm.n_ctx, len(tokens)),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        stop=_stops(stop, cp.stop),
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repeat_penalty=repeat_penalty,
        logit_bias=_logit_bias(logit_bias),
        ignore_eos=ignore_eos,
        draft_max=draft_max,
        draft_min=draft_min,
        draft_p_min=draft_p_min,
        cache_prompt=cache_prompt,
    )
    gen = Generation(llm, tokens, cfg)
    meta: _Meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or llm.model_name}
    if stream:
        return _chat_chunks(gen, cancel, cp, meta)
    return _chat_completion(gen, cancel, cp, meta)


def _chat_completion(gen: Generation, cancel: Callable[[], bool] | None, cp: ChatPrompt, meta: _Meta) -> ChatCompletion:
    """The whole reply, parsed by the template's parser (reasoning, tool calls)."""
    text = "".join(step.text for step in gen.run(cancel))
    reply = _parse_final(text, cp)
    msg: ChatCompletionMessage = {"role": "assistant", "content": reply.content}
    if reply.reasoning_content:
        msg["reasoning_content"] = reply.reasoning_content
    finish = _finish(gen.finish)
    if reply.tool_calls:
        msg["tool_calls"] = _tool_calls(reply)
        finish = "tool_calls"
    res: ChatCompletion = {
        "id": meta["id"],
        "object": "chat.completion",
        "created": meta["created"],
        "model": meta["model"],
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
        "usage": gen.usage(),
        "timings": gen.timings(),
    }
    return res


def _parse_final(text: str, cp: ChatPrompt) -> ChatReply:
    try:
        return ChatTemplate.parse(text, cp)
    except ChatTemplateError:
        return ChatReply(text, "", ())  # the model did not follow the template's format: all of it is content


def _tool_calls(reply: ChatReply) -> list[ChatCompletionToolCall]:
    return [
        {
            "id": cid or f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": args},
        }
        for name, args, cid in reply.tool_calls
    ]


def _chat_chunks(
    gen: Generation, cancel: Callable[[], bool] | None, cp: ChatPrompt, meta: _Meta
) -> Iterator[ChatCompletionChunk]:
    def chunk(delta: ChatCompletionChunkDelta, finish: FinishReasonOAI | None = None) -> ChatCompletionChunk:
        return {
            "id": meta["id"],
            "object": "chat.completion.chunk",
            "created": meta["created"],
            "model": meta["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    sent = {"content": "", "reasoning_content": ""}

    def deltas(reply: ChatReply) -> ChatCompletionChunkDelta | None:
        d: ChatCompletionChunkDelta = {}
        parts: tuple[tuple[Literal["reasoning_content", "content"], str], ...] = (
            ("reasoning_content", reply.reasoning_content),
            ("content", reply.content),
        )
        for key, now in parts:
            before = sent[key]
            if len(now) > len(before) and now.startswith(before):
                d[key] = now[len(before) :]
                sent[key] = now
        return d or None

    it = gen.run(cancel)
    text = ""
    started = False
    try:
        for step in it:
            if not started:  # after the first step: a prompt that fails fails before any chunk
                started = True
                yield chunk({"role": "assistant", "content": ""})
            if not step.text:
                continue
            text += step.text
            if not cp.needs_parse:
                sent["content"] = text
                yield chunk({"content": step.text})
                continue
            try:
                d = deltas(ChatTemplate.parse(text, cp, partial=True))
            except ChatTemplateError:
                continue
            if d:
                yield chunk(d)
        if not started:
            yield chunk({"role": "assistant", "content": ""})
        finish = _finish(gen.finish)
        if cp.needs_parse:
            reply = _parse_final(text, cp)
            d = deltas(reply)
            if d:
                yield chunk(d)
            if reply.tool_calls:
                yield chunk({"tool_calls": [dict(tc, index=i) for i, tc in enumerate(_tool_calls(reply))]})
                finish = "tool_calls"
        last = chunk({}, finish)
        last["usage"] = gen.usage()
        last["timings"] = gen.timings()
        yield last
    finally:
        it.close()
