"""``create_completion`` / ``create_chat_completion``: OpenAI-shaped results
(see ``openai_types``) on top of the generation loop (``_generation``), as in
llama-cpp-python, plus llama-server's ``timings`` with DFlash's draft counts.

This module does not know ``Llama``: it needs only what ``CompletionHost``
names (``Llama`` provides it and delegates here)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol, TypedDict, TypeVar

from ..config import Grammar, ModelConfig, SamplingConfig
from ..engine.generation import Generation, GenerationHost, Prompt
from ..engine.request import make_request
from ..errors import ChatTemplateError
from ..options import LLAMA_CPP_DEFAULTS, OPTIONS
from ..pair import ContextPair
from ..results import FinishReason, PromptProgress, TokenLogprob
from .chat import ChatPrompt, ChatReply, ChatTemplate, ToolChoice
from .logprobs import chat_logprobs, completion_logprobs
from .speculation import StreamSpeculation
from .structured import chat_grammar, constraint
from .types import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionChunkDelta,
    ChatCompletionMessage,
    ChatCompletionToolCall,
    ChatLogprobs,
    Completion,
    CompletionChunk,
    FinishReasonOAI,
    PromptProgressJSON,
)

__all__ = [
    "MAX_CHOICES",
    "CompletionHost",
    "chat_prompt",
    "chat_prompt_tokens",
    "create_chat_completion",
    "create_completion",
]


class CompletionHost(GenerationHost, Protocol):
    """What completions need from the object that owns the model (``Llama``)."""

    @property
    def config(self) -> ModelConfig:
        """The model's options (the seed of a request that names none)."""
        ...

    @property
    def pair(self) -> ContextPair:
        """The step API a request is checked against (one sequence's context, the block)."""
        ...

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """A prompt's token ids (text tokenized, ids checked)."""
        ...

    @property
    def model_name(self) -> str:
        """The model id responses report (``model``)."""
        ...

    @property
    def chat_template(self) -> ChatTemplate:
        """The template that turns messages into a prompt."""
        ...


MAX_CHOICES = 16  # n: choices of one request
_CORE = SamplingConfig()  # the core's defaults, where llama-cpp-python's are the same

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


def _budget(max_tokens: int | None) -> int | None:
    """llama-cpp-python's ``max_tokens``: None or <= 0 runs until the context is full
    (SamplingConfig's None; the generation computes what is left)."""
    return None if max_tokens is None or max_tokens <= 0 else max_tokens


def _progress_json(p: PromptProgress) -> PromptProgressJSON:
    return {"total": p.total, "cache": p.cache, "processed": p.processed, "time_ms": p.time_ms}


# the options both completion functions pass to SamplingConfig as they are, by their names in the
# declaration's "llama_cpp" column (pydflash.options); the others each function converts itself
_CONVERTED = ("max_tokens", "stop", "logit_bias", "logprobs", "top_logprobs", "grammar", "json_schema")
_PLAIN = tuple(
    (o.name, wire) for o in OPTIONS if (wire := o.names["llama_cpp"]) is not None and o.name not in _CONVERTED
)


def _passed(args: Mapping[str, Any], function: str) -> dict[str, Any]:
    """The plain options among a completion function's arguments, under SamplingConfig's names:
    its parameters (llama-cpp-python's, written out) and, in ``options`` (its ``**options``), the
    declared ones it does not write out, by their names in the "llama_cpp" column; another name
    there is a TypeError, as an unknown keyword of a written-out signature would be."""
    extra = dict(args["options"])
    out = {
        name: args[wire] if wire in args else extra.pop(wire) for name, wire in _PLAIN if wire in args or wire in extra
    }
    if extra:
        raise TypeError(f"{function}() got an unexpected keyword argument '{next(iter(extra))}'")
    return out


def _unsupported(**kw: Any) -> None:
    for name, value in kw.items():
        if value not in (None, False, 0):
            raise ValueError(f"{name} is not supported by pydflash")


# -- completions --------------------------------------------------------------


def create_completion(
    llm: CompletionHost,
    prompt: str | Sequence[int],
    suffix: str | None = None,
    max_tokens: int | None = 16,
    temperature: float = LLAMA_CPP_DEFAULTS.temperature,
    top_p: float = LLAMA_CPP_DEFAULTS.top_p,
    min_p: float = LLAMA_CPP_DEFAULTS.min_p,
    echo: bool = False,
    stop: Stop = None,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repeat_penalty: float = _CORE.repeat_penalty,
    top_k: int = LLAMA_CPP_DEFAULTS.top_k,
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
    typical_p: float = _CORE.typical_p,
    top_n_sigma: float = _CORE.top_n_sigma,
    penalty_last_n: int = _CORE.penalty_last_n,
    post_sampling_probs: bool = False,
    response_format: Mapping[str, Any] | None = None,
    json_schema: Mapping[str, Any] | None = None,
    grammar: str | Grammar | None = None,
    id_slot: int | None = None,
    n: int = 1,
    cancel: Callable[[], bool] | None = None,
    verify: str | None = None,
    return_progress: bool = False,
    timings_per_token: bool = False,
    **options: Any,
) -> Completion | Iterator[CompletionChunk]:
    """An OpenAI-style text completion of ``prompt`` (text or ids); defaults as llama-cpp-python's (``max_tokens=None``
    fills the context). ``draft_*``, ``verify``: as ``Llama.generate``'s. ``logprobs=N``: each token's logprob and the N
    likeliest (raw, or post_sampling_probs's). ``response_format``, ``json_schema``, ``grammar`` (GBNF): the text obeys
    it. ``id_slot``: that slot (-1/None: any). ``n`` choices, seeds ``seed``, ``seed + 1``... ``cancel``: asked after
    each step of a stream (else every 0.1 s); True raises ``GenerationInterrupted``. ``return_progress``,
    ``timings_per_token``: llama-server's, with ``stream``. ``options``: the other per-request options that
    ``pydflash.options`` declares (generate()'s keywords not written out here), by name."""
    args = locals()  # the keywords by name, before any other local: _passed reads the options
    passed = _passed(args, "create_completion")  # an unknown keyword fails first
    _unsupported(suffix=suffix, **{"logprobs with echo": logprobs is not None and echo})
    schema, gbnf = constraint(response_format, json_schema, grammar)
    tokens = llm.prompt_tokens(prompt)
    cfg = SamplingConfig.build(
        **passed,
        max_tokens=_budget(max_tokens),
        stop=_stops(stop),
        logit_bias=_logit_bias(logit_bias),
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        grammar=gbnf,
        json_schema=schema,
    )
    gens = _generations(llm, tokens, cfg, id_slot, n, stream and return_progress, stream and timings_per_token)
    meta: _Meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or llm.model_name}
    head = _echo(llm, prompt, tokens) if echo else ""
    if stream:
        return _chained([_completion_chunks(g, cancel, meta, head) for g in gens], gens)
    if len(gens) > 1:  # every choice read as its steps come: each one's stop strings searched
        Generation.run_all(gens, cancel)
    return _merged([_completion(g, cancel, meta, head) for g in gens])


def _echo(llm: CompletionHost, prompt: str | Sequence[int], tokens: list[int]) -> str:
    """The prompt as text, for ``echo``."""
    if isinstance(prompt, str):
        return prompt
    return llm.core_model.detokenize(tokens).decode("utf-8", errors="replace")


def _generations(
    llm: CompletionHost, tokens: list[int], cfg: SamplingConfig, slot: int | None, n: int, progress: bool, timed: bool
) -> list[Generation]:
    """``n`` generations of one prompt, with seeds ``seed``, ``seed + 1``, ... (each
    its own draw; greedy choices are alike), all started before any is read."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise ValueError(f"n must be an int in [1, {MAX_CHOICES}], got {n!r}")

    def generation(c: SamplingConfig) -> Generation:
        request = make_request(tokens, c, llm.pair, llm.config, slot=slot, progress=progress, timings_per_token=timed)
        return Generation(llm, request)

    if n == 1:
        return [generation(cfg)]
    base = cfg.seed if cfg.seed is not None else llm.config.seed
    gens = [generation(cfg if base < 0 else dataclasses.replace(cfg, seed=base + i)) for i in range(n)]
    for g in gens:
        g.submit()
    return gens


_Response = TypeVar("_Response", Completion, ChatCompletion)
_Chunk = TypeVar("_Chunk", CompletionChunk, ChatCompletionChunk)


def _merged(results: list[_Response]) -> _Response:
    """One response with each result's choice at its index; usage over all of them."""
    out = results[0]
    if len(results) > 1:
        out["choices"] = [dict(r["choices"][0], index=i) for i, r in enumerate(results)]  # type: ignore[misc]
        n_gen = sum(r["usage"]["completion_tokens"] for r in results)
        n_prompt = out["usage"]["prompt_tokens"]
        out["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}
    return out


def _chained(streams: list[Iterator[_Chunk]], gens: list[Generation]) -> Iterator[_Chunk]:
    """The choices' chunks, one choice after the other (they run side by side);
    leaving early stops them all."""
    if len(streams) == 1:
        return streams[0]
    return _chain(streams, gens)


def _chain(streams: list[Iterator[_Chunk]], gens: list[Generation]) -> Iterator[_Chunk]:
    for g in gens[1:]:  # their stop strings searched as their steps come, until they are read
        g.watch()
    try:
        for i, chunks in enumerate(streams):
            for chunk in chunks:
                chunk["choices"][0]["index"] = i
                yield chunk
    finally:
        for g in gens:
            g.cancel()


def _completion(gen: Generation, cancel: Callable[[], bool] | None, meta: _Meta, head: str) -> Completion:
    # asleep until the end (a reader woken per step slows the engine's thread); a client
    # that left is noticed within CANCEL_POLL_S
    text = head + "".join(step.text for step in gen.wait(cancel))
    lps = None if gen.logprobs is None else completion_logprobs(gen.model.token_to_piece, gen.logprobs, 0)
    res: Completion = {
        "id": meta["id"],
        "object": "text_completion",
        "created": meta["created"],
        "model": meta["model"],
        "choices": [{"text": text, "index": 0, "logprobs": lps, "finish_reason": _finish(gen.finish)}],
        "usage": gen.usage(),
        "timings": gen.timings(),
        "speculative": gen.speculative(),
    }
    return res


def _completion_chunks(
    gen: Generation, cancel: Callable[[], bool] | None, meta: _Meta, head: str
) -> Iterator[CompletionChunk]:
    offset = 0  # characters of generated text before this chunk's tokens

    def chunk(text: str, finish: FinishReasonOAI | None, lps: Sequence[TokenLogprob] | None = None) -> CompletionChunk:
        nonlocal offset
        logprobs = None
        if lps is not None:
            logprobs = completion_logprobs(gen.model.token_to_piece, lps, offset)
            offset += sum(len(t) for t in logprobs["tokens"])
        return {
            "id": meta["id"],
            "object": "text_completion",
            "created": meta["created"],
            "model": meta["model"],
            "choices": [{"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}],
        }

    spec = StreamSpeculation(gen)  # the per-chunk speculative (with timings_per_token)
    it = spec.follow(gen.run(cancel))
    try:
        if head:
            yield chunk(head, None)
        for step in it:
            if step.prompt_progress is not None:
                progress = chunk("", None)
                progress["prompt_progress"] = _progress_json(step.prompt_progress)
                yield spec.timed(progress, step)
            elif step.text or step.logprobs:
                yield spec.timed(chunk(step.text, None, step.logprobs), step)
        yield spec.counted(chunk("", _finish(gen.finish)))
    finally:
        it.close()


# -- chat -----------------------------------------------------------------------


def create_chat_completion(
    llm: CompletionHost,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.2,  # llama-cpp-python's chat default
    top_p: float = LLAMA_CPP_DEFAULTS.top_p,
    top_k: int = LLAMA_CPP_DEFAULTS.top_k,
    min_p: float = LLAMA_CPP_DEFAULTS.min_p,
    stop: Stop = None,
    seed: int | None = None,
    stream: bool = False,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    repeat_penalty: float = _CORE.repeat_penalty,
    logit_bias: Mapping[Any, float] | None = None,
    model: str | None = None,
    logprobs: bool | None = None,
    top_logprobs: int | None = None,
    *,
    enable_thinking: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    ignore_eos: bool = False,
    draft_max: int | None = None,
    draft_min: int = 0,
    draft_p_min: float = 0.0,
    cache_prompt: bool = True,
    typical_p: float = _CORE.typical_p,
    top_n_sigma: float = _CORE.top_n_sigma,
    penalty_last_n: int = _CORE.penalty_last_n,
    post_sampling_probs: bool = False,
    response_format: Mapping[str, Any] | None = None,
    json_schema: Mapping[str, Any] | None = None,
    grammar: str | Grammar | None = None,
    id_slot: int | None = None,
    n: int = 1,
    cancel: Callable[[], bool] | None = None,
    verify: str | None = None,
    return_progress: bool = False,
    timings_per_token: bool = False,
    template_format: bool = True,
    tool_choice: ToolChoice | None = None,
    **options: Any,
) -> ChatCompletion | Iterator[ChatCompletionChunk]:
    """An OpenAI-style chat completion of ``messages`` through the chat template (the reply format, tools and
    ``tool_choice``: ``ChatTemplate.apply``; ``template_format=False``: --no-jinja). Others: create_completion's."""
    args = locals()  # the keywords by name, before any other local: _passed reads the options
    passed = _passed(args, "create_chat_completion")
    _check_top_logprobs(logprobs, top_logprobs)
    schema, gbnf = constraint(response_format, json_schema, grammar)
    tmpl = _TemplateArgs(enable_thinking, chat_template_kwargs, template_format, tool_choice)
    cp = _chat_prompt(llm, messages, tools, tmpl, schema, gbnf)
    cfg = SamplingConfig.build(
        **passed,
        max_tokens=_budget(max_tokens),
        stop=_stops(stop, cp.stop),
        logit_bias=_logit_bias(logit_bias),
        logprobs=bool(logprobs),
        top_logprobs=top_logprobs or 0,
        grammar=chat_grammar(cp, (schema, gbnf), lambda text: _generation_prompt_tokens(llm, text)),
    )
    gens = _generations(
        llm, chat_prompt_tokens(llm, cp), cfg, id_slot, n, stream and return_progress, stream and timings_per_token
    )
    meta: _Meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model or llm.model_name}
    if stream:
        return _chained([_chat_chunks(g, cancel, cp, meta) for g in gens], gens)
    if len(gens) > 1:  # as create_completion's
        Generation.run_all(gens, cancel)
    return _merged([_chat_completion(g, cancel, cp, meta) for g in gens])


def _check_top_logprobs(logprobs: bool | None, top_logprobs: int | None) -> None:
    if top_logprobs is not None and not logprobs:
        raise ValueError("top_logprobs needs logprobs=True")


def _chat_completion(gen: Generation, cancel: Callable[[], bool] | None, cp: ChatPrompt, meta: _Meta) -> ChatCompletion:
    """The whole reply, parsed by the template's parser (reasoning, tool calls)."""
    text = "".join(step.text for step in gen.wait(cancel))  # asleep until the end, as _completion
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
        "choices": [{"index": 0, "message": msg, "logprobs": _chat_lps(gen, gen.logprobs), "finish_reason": finish}],
        "usage": gen.usage(),
        "timings": gen.timings(),
        "speculative": gen.speculative(),
    }
    return res


# the template's own arguments, which chat_template_kwargs cannot repeat
_OWN_ARGUMENTS = ("messages", "tools", "json_schema", "grammar")


@dataclasses.dataclass(frozen=True)
class _TemplateArgs:
    """How a chat request asks its template to render (beside messages, tools, constraint)."""

    enable_thinking: bool = True
    kwargs: Mapping[str, Any] | None = None  # chat_template_kwargs
    template_format: bool = True  # False: llama-server's --no-jinja (the reply is all content)
    tool_choice: ToolChoice | None = None


def _chat_prompt(
    llm: CompletionHost,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    tmpl: _TemplateArgs,
    schema: Mapping[str, Any] | None,
    gbnf: str | None,
) -> ChatPrompt:
    if not tmpl.template_format:
        if tmpl.tool_choice not in (None, "auto"):  # llama-server's rule
            raise ValueError("tool_choice needs the template's reply format (llama-server: the --jinja flag)")
        cp = _chat_prompt(llm, messages, None, _TemplateArgs(tmpl.enable_thinking, tmpl.kwargs), None, None)
        return _text_only(cp, tools)
    if gbnf is not None and tools and tmpl.tool_choice != "none":
        raise ValueError("a custom grammar cannot be combined with tools")
    enable_thinking = tmpl.enable_thinking
    kwargs = dict(tmpl.kwargs or {})
    if "enable_thinking" in kwargs:
        enable_thinking = bool(kwargs.pop("enable_thinking"))
    # llama-server reads add_generation_prompt from here too (False: continue the last message)
    add_generation_prompt = bool(kwargs.pop("add_generation_prompt", True))
    for name in _OWN_ARGUMENTS:
        if name in kwargs:
            raise ValueError(f"chat_template_kwargs cannot set '{name}' (pass it as its own argument)")
    return llm.chat_template.apply(
        messages,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        tools=tools,
        json_schema=schema,
        grammar=gbnf,
        tool_choice=tmpl.tool_choice,
        **kwargs,
    )


def _text_only(cp: ChatPrompt, tools: Sequence[Mapping[str, Any]] | None) -> ChatPrompt:
    """``cp`` without its reply format (llama-server's ``--no-jinja``): the template renders
    the messages only; the constraint is the request's own grammar, not framed in the
    template's reply format; the reply is all content; ``tools`` are refused."""
    if tools:
        raise ValueError("tools need the template's reply format (llama-server: the --jinja flag)")
    return dataclasses.replace(
        cp, format="Content-only", format_id=0, parser="", supports_thinking=False, grammar="", grammar_lazy=False
    )


def chat_prompt(llm: CompletionHost, messages: Sequence[Mapping[str, Any]], **kw: Any) -> str:
    """The prompt ``create_chat_completion(llm, messages, **kw)`` generates from: the chat
    template's, with the tools and reply format ``kw`` asks for."""
    schema, gbnf = constraint(kw.get("response_format"), kw.get("json_schema"), kw.get("grammar"))
    thinking = bool(kw.get("enable_thinking", True))
    tmpl = _TemplateArgs(thinking, kw.get("chat_template_kwargs"), True, kw.get("tool_choice"))
    return _chat_prompt(llm, messages, kw.get("tools"), tmpl, schema, gbnf).prompt


def chat_prompt_tokens(llm: CompletionHost, cp: ChatPrompt) -> list[int]:
    """The token ids a chat generation starts from: those the template made with the text
    (``ChatPrompt.tokens``), else (a template without a model, an empty prompt) ``prompt_tokens``'s."""
    return list(cp.tokens) if cp.tokens else llm.prompt_tokens(cp.prompt)


def _generation_prompt_tokens(llm: CompletionHost, text: str) -> list[int]:
    """The template's assistant prefix as tokens (llama.cpp's rule: without a leading
    space token that the text itself does not start with)."""
    toks = llm.core_model.tokenize(text, False, True)
    if toks and not text[:1].isspace() and llm.core_model.token_to_piece(toks[0], True)[:1].isspace():
        toks = toks[1:]
    return toks


def _chat_lps(gen: Generation, lps: Sequence[TokenLogprob] | None) -> ChatLogprobs | None:
    return None if lps is None else chat_logprobs(gen.model.token_to_piece, lps)


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


def _deltas(reply: ChatReply, sent: dict[str, str]) -> ChatCompletionChunkDelta | None:
    """What ``reply`` adds to the text and reasoning already ``sent`` (updated)."""
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


def _chat_chunks(
    gen: Generation, cancel: Callable[[], bool] | None, cp: ChatPrompt, meta: _Meta
) -> Iterator[ChatCompletionChunk]:
    # logprobs of tokens not yet sent: they ride on the next chunk (a step's text may
    # produce no delta until the template's parser sees more)
    pending: list[TokenLogprob] | None = None if gen.logprobs is None else []

    def chunk(delta: ChatCompletionChunkDelta, finish: FinishReasonOAI | None = None) -> ChatCompletionChunk:
        lps = None
        if pending:
            lps = _chat_lps(gen, pending)
            pending.clear()
        return {
            "id": meta["id"],
            "object": "chat.completion.chunk",
            "created": meta["created"],
            "model": meta["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}],
        }

    sent = {"content": "", "reasoning_content": ""}

    spec = StreamSpeculation(gen)  # the per-chunk speculative (with timings_per_token)
    it = spec.follow(gen.run(cancel))
    text = ""
    started = False
    try:
        for step in it:
            if step.prompt_progress is not None:  # llama-server's progress delta: the role alone
                progress = chunk({"role": "assistant"})
                progress["prompt_progress"] = _progress_json(step.prompt_progress)
                yield spec.timed(progress, step)
                continue
            if not started:  # after the first step: a prompt that fails fails before any chunk
                started = True  # the role alone, as llama-cpp-python (the server adds llama-server's content null)
                yield chunk({"role": "assistant"})
            if pending is not None and step.logprobs:
                pending.extend(step.logprobs)
            if not step.text:
                continue
            text += step.text
            if not cp.needs_parse:
                sent["content"] = text
                yield spec.timed(chunk({"content": step.text}), step)
                continue
            try:
                d = _deltas(ChatTemplate.parse(text, cp, partial=True), sent)
            except ChatTemplateError:
                continue
            if d:
                yield spec.timed(chunk(d), step)
        if not started:
            yield chunk({"role": "assistant"})
        finish = _finish(gen.finish)
        if cp.needs_parse:
            reply = _parse_final(text, cp)
            d = _deltas(reply, sent)
            if d:
                yield spec.timed_now(chunk(d))
            if reply.tool_calls:
                calls = [dict(tc, index=i) for i, tc in enumerate(_tool_calls(reply))]
                yield spec.timed_now(chunk({"tool_calls": calls}))
                finish = "tool_calls"
        yield spec.counted(chunk({}, finish))
    finally:
        it.close()
