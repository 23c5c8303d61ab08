"""One generation: a prompt, its sampling settings, and what comes of it.
The engine (``_engine.Engine``) runs it in a sequence slot, speculative step
after step, until EOS, a stop string, ``max_tokens`` or a full context, and
hands each step to the consumer (``__iter__``/``__aiter__``). ``Llama.generate``/
``stream``/``submit`` and the OpenAI-style completions (and through them the
server) all use it.

It needs only what ``GenerationHost`` names (``Llama`` provides it), so this
module imports nothing that imports it back."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Protocol

from .. import _core
from ..config import ModelConfig, SamplingConfig
from ..errors import ContextLimitError, GenerationInterrupted
from ..pair import ContextPair
from ..results import (
    CompletionUsage,
    FinishReason,
    GenerationResult,
    GenerationStats,
    PromptProgress,
    SpeculativeStats,
    StreamStep,
    Timings,
    TokenLogprob,
    by_source,
)
from .text import TextAssembler

__all__ = ["Generation", "GenerationHost", "Prompt"]

Prompt = str | Sequence[int]

CANCEL_POLL_S = 0.1  # how often a caller that waits for the end asks its cancel check


class GenerationHost(Protocol):
    """What a generation needs from the object that owns the model (``Llama``)."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def pair(self) -> ContextPair: ...

    @property
    def core_model(self) -> _core.Model: ...

    def prompt_tokens(self, prompt: Prompt) -> list[int]: ...

    def run_generation(self, gen: Generation) -> None: ...

    def cancel_generation(self, gen: Generation) -> None: ...


class _Channel:
    """Steps from the engine thread to one consumer, blocking or async."""

    def __init__(self) -> None:
        self._items: collections.deque[StreamStep | BaseException] = collections.deque()
        self._cv = threading.Condition()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        # its consumer waits for the end only (until_end): no wake-up per step (and its
        # generation sends nothing before the end: Generation.take_step)
        self.quiet = False
        self._ended = False  # the last item (the finishing step or an error) is in

    def put(self, item: StreamStep | BaseException) -> None:
        end = isinstance(item, BaseException) or item.finish_reason is not None
        with self._cv:
            self._items.append(item)
            self._ended = self._ended or end
            waiter = None
            if end or not self.quiet:
                self._cv.notify()
                waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            loop.call_soon_threadsafe(_wake, fut)

    def get(self) -> StreamStep | BaseException:
        with self._cv:  # a lock wait: Ctrl-C interrupts it
            while not self._items:
                self._cv.wait()
            return self._items.popleft()

    def until_end(self, timeout: float | None = None) -> list[StreamStep | BaseException] | None:
        """Every item up to the last, waiting for it asleep (None: not there after
        ``timeout`` seconds): a consumer woken for each step would take the GIL and a
        core from the engine's thread while the next step computes."""
        with self._cv:  # a lock wait: Ctrl-C interrupts it
            self.quiet = True
            if not self._cv.wait_for(lambda: self._ended, timeout):
                return None
            items = list(self._items)
            self._items.clear()
            return items

    async def auntil_end(self) -> list[StreamStep | BaseException]:
        """``until_end`` for asyncio: the event loop is woken once, at the end."""
        while True:
            with self._cv:
                self.quiet = True
                if self._ended:
                    items = list(self._items)
                    self._items.clear()
                    return items
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            await fut

    async def aget(self) -> StreamStep | BaseException:
        while True:
            with self._cv:
                if self._items:
                    return self._items.popleft()
                loop = asyncio.get_running_loop()
                fut: asyncio.Future[None] = loop.create_future()
                self._waiter = (loop, fut)
            await fut


def _step_or_raise(item: StreamStep | BaseException) -> StreamStep:
    """What the engine sent a consumer: a step, or the error that ends it."""
    if isinstance(item, BaseException):
        raise item
    return item


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Generation:
    """One generation of ``config`` after ``prompt``; iterate it (or ``async
    for``) for one ``StreamStep`` per speculative step, or per run of plain
    steps that the engine took in one call (the last carries the finish reason).
    Iterating submits it to the host's engine; leaving the iteration early
    cancels it.

    The prompt is tokenized and checked (its length against one sequence's
    context, the draft options against the pair) here, in the caller's thread,
    before anything runs. After it: ``tokens``, ``steps`` (the core's step
    results), ``prefill_s``/``decode_s``, ``n_cached``, ``finish`` and
    ``result()``, ``usage()``, ``timings()``."""

    def __init__(
        self,
        host: GenerationHost,
        prompt: Prompt,
        config: SamplingConfig,
        *,
        slot: int | None = None,
        progress: bool = False,
        timings_per_token: bool = False,
        per_token: bool = False,
    ):
        self.host = host
        self.config = config
        self.prompt: list[int] = host.prompt_tokens(prompt)
        pair = host.pair
        self.n_ctx = limit = pair.n_ctx  # one sequence's context
        if len(self.prompt) > limit - 1:
            where = f"a sequence's context holds {limit}" if pair.n_parallel > 1 else f"the context holds {limit}"
            raise ContextLimitError(
                f"prompt has {len(self.prompt)} tokens but {where} (at most {limit - 1} prompt tokens leave room "
                "to generate)",
                n_prompt_tokens=len(self.prompt),
                n_ctx=limit,
            )
        if slot is not None and (
            isinstance(slot, bool) or not isinstance(slot, int) or not -1 <= slot < pair.n_parallel
        ):
            raise ValueError(f"slot must be -1 or an int in [0, {pair.n_parallel}), got {slot!r}")
        self.slot = None if slot is None or slot < 0 else slot  # None: the engine picks
        pair.check_draft(config)  # before any work: draft_max within the block
        self.model = model = host.core_model
        self.text = TextAssembler(lambda t: model.token_to_piece(t, False), config.stop)
        self.tokens: list[int] = []
        # one per token, in step with self.tokens, with logprobs=True
        self.logprobs: list[TokenLogprob] | None = [] if config.logprobs else None
        self.n_released = 0  # tokens already handed to a stream consumer
        self._held: list[tuple[str, int]] = []  # text and tokens released, not handed yet
        self.steps: list[_core.StepResult] = []
        self.n_drafted = self.n_accepted = 0  # over its steps (timings() is read after each, per token)
        self.finish: FinishReason | None = None
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.n_cached = 0  # prompt tokens taken from the prompt cache
        seed = config.seed if config.seed is not None else host.config.seed
        self.seed = seed if seed >= 0 else random.getrandbits(63)
        self.config = config = config.for_seed(seed >= 0)  # verify=None: "coupled" when seeded
        # the engine chooses each step's draft length (draft_length/) unless one is pinned
        # (here or by the Llama), adaptive lengths are off, or a seeded sample must
        # reproduce: its random draws follow the draft lengths, which follow timings
        # (verify="coupled" draws none: its noise is keyed by position, any length reproduces)
        sampled_with_seed = config.temperature > 0 and config.top_k != 1 and seed >= 0 and config.verify != "coupled"
        self.adaptive = (
            (pair.has_drafter or pair.drafter_kind == "mtp")
            and config.draft_max is None
            and host.config.draft_max is None
            and host.config.draft_adaptive
            and not sampled_with_seed
        )
        self.channel = _Channel()
        # llama-server's return_progress: an empty step with its prompt_progress when the
        # prompt starts and after each chunk of it is evaluated
        self.progress = progress
        self._processed = -1  # the last progress event's (a chunk that gave it none sends none)
        # llama-server's timings_per_token: each step's event carries the timings as they stand
        self.timings_per_token = timings_per_token
        # llama-server's native stream: one event per token (its own logprobs and timings),
        # speculative step or not, with the text that token made final
        self.per_token = per_token
        self.n_prompt_done = 0  # prompt tokens evaluated so far (the cache's not counted)
        self.cancelled = False  # the consumer left: the engine drops it
        self.cancel_check: Callable[[], bool] | None = None
        self.submitted = False
        self.done = False  # finished, failed or cancelled (set by the engine)
        self.t_submit = 0.0
        self.t_start = 0.0
        self.t_decode = 0.0

    # -- the consumer's side ---------------------------------------------------

    def __iter__(self) -> Iterator[StreamStep]:
        return self._consume()

    def run(self, cancel: Callable[[], bool] | None = None) -> Generator[StreamStep, None, None]:
        """The steps; ``cancel()`` (when given) is asked after each unfinished
        one, and True stops the generation with ``GenerationInterrupted``."""
        self.cancel_check = cancel  # the engine also asks it before the prompt is evaluated
        it = self._consume()
        try:
            for step in it:
                yield step
                if cancel is not None and step.finish_reason is None and cancel():
                    raise GenerationInterrupted("the generation was cancelled")
        finally:
            it.close()  # a consumer that stops early ends the generation now

    def wait(self, cancel: Callable[[], bool] | None = None) -> list[StreamStep]:
        """Run it to the end for a caller that wants only what it gives (``result()``),
        asleep until then rather than woken for each step; its steps not read yet (one,
        with everything, where nothing read it before), or its error. ``cancel()``
        (when given) is asked every CANCEL_POLL_S seconds once it runs (while it waits
        for a slot only the engine asks, as it admits it): True stops it with
        ``GenerationInterrupted``. Ctrl-C while waiting cancels it, as leaving an
        iteration does."""
        self.cancel_check = cancel  # the engine also asks it before the prompt is evaluated
        self.channel.quiet = True  # from its first step
        self.submit()
        try:
            while (items := self.channel.until_end(None if cancel is None else CANCEL_POLL_S)) is None:
                if cancel is not None and self.t_start > 0 and cancel():  # admitted: the engine asked first
                    raise GenerationInterrupted("the generation was cancelled")
            return [_step_or_raise(item) for item in items]
        finally:
            self.cancel()

    async def await_end(self) -> list[StreamStep]:
        """``wait()`` for asyncio, without blocking the event loop; a task that stops
        awaiting (cancelled) cancels the generation."""
        self.channel.quiet = True
        self.submit()
        try:
            return [_step_or_raise(item) for item in await self.channel.auntil_end()]
        finally:
            self.cancel()

    def submit(self) -> None:
        """Hand it to the engine (once); its steps then queue for the consumer."""
        if not self.submitted:
            self.submitted = True
            self.t_submit = time.perf_counter()
            self.host.run_generation(self)

    def cancel(self) -> None:
        """Stop it between steps (or abort its decode when it runs alone); its
        sequence's cache stays valid and a reader gets GenerationInterrupted. No
        effect once done."""
        if self.submitted and not self.done and not self.cancelled:
            self.host.cancel_generation(self)
            self.channel.put(GenerationInterrupted("the generation was cancelled"))

    def _consume(self) -> Generator[StreamStep, None, None]:
        self.submit()
        try:
            while True:
                step = _step_or_raise(self.channel.get())
                yield step
                if step.finish_reason is not None:
                    return
        finally:
            self.cancel()

    async def _aconsume(self) -> AsyncIterator[StreamStep]:
        self.submit()
        try:
            while True:
                step = _step_or_raise(await self.channel.aget())
                yield step
                if step.finish_reason is not None:
                    return
        finally:
            self.cancel()

    def __aiter__(self) -> AsyncIterator[StreamStep]:
        return self._aconsume()

    # -- the engine's side (its thread) ------------------------------------------

    def started(self, n_cached: int) -> None:
        """Admitted to a slot; ``n_cached`` prompt tokens came from its cache."""
        self.n_cached = n_cached
        self.t_start = time.perf_counter()
        self._progress(n_cached)

    def prefill_progress(self, n_left: int) -> None:
        """A chunk of its prompt is evaluated; ``n_left`` tokens wait (the last one is
        evaluated with the first step)."""
        processed = len(self.prompt) - 1 - n_left
        self.prefill_s = time.perf_counter() - self.t_start
        self.n_prompt_done = max(processed - self.n_cached, 0)
        self._progress(processed)

    def prefilled(self) -> None:
        """Its prompt is evaluated (in chunks, between other sequences' steps)."""
        now = time.perf_counter()
        self.prefill_s = now - self.t_start
        self.n_prompt_done = len(self.prompt) - self.n_cached
        self.t_decode = now
        self._progress(len(self.prompt))

    def _progress(self, processed: int) -> None:
        if self.progress and processed > self._processed:
            self._processed = processed
            ms = int((time.perf_counter() - self.t_start) * 1e3)
            event = PromptProgress(total=len(self.prompt), cache=self.n_cached, processed=processed, time_ms=ms)
            timings = self.timings() if self.timings_per_token else None
            self.channel.put(StreamStep([], "", 0, 0, [], prompt_progress=event, timings=timings))

    @property
    def max_tokens(self) -> int:
        """Its token budget: ``max_tokens``, or (None) what the context has left after
        the prompt (llama-cpp-python's ``max_tokens=None``, llama-server's ``n_predict`` -1)."""
        n = self.config.max_tokens
        return self.n_ctx - len(self.prompt) if n is None else n

    @property
    def tokens_left(self) -> int:
        """Tokens it may still generate: the one rule for the token budget."""
        return self.max_tokens - len(self.tokens)

    def next_draft_max(self, n_past: int, n_ctx: int, default_draft_max: int) -> int | None:
        """This step's draft_max, or None when the generation ends here ("length")."""
        remaining = self.tokens_left
        if remaining <= 0 or n_past >= n_ctx:
            self.finish = "length"
            self._cut_at_stop()
            self._deliver(self._event(None))
            return None
        if remaining == 1:  # one token left: no draft could be kept
            return 0
        # the block length asked of the drafter (None: the pair's default); what is
        # kept of any draft is cut to the tokens left (the step's budget)
        return -1 if self.config.draft_max is None else self.config.draft_max

    def take_step(self, step: _core.StepResult, deliver: bool = True) -> None:
        """One step's tokens: EOS, max_tokens, stop strings; delivered as a StreamStep
        (to a reader that waits for the end only, one at the end, with every token and
        all the text not delivered before: one per step would cost the engine's thread
        more than a small model's plain step can spare; so too, ``deliver`` False, with
        the next step delivered, where the engine ran several in one call)."""
        self.steps.append(step)
        self.n_drafted += step.n_drafted
        self.n_accepted += step.n_accepted
        if self.per_token and not self.channel.quiet:
            self._take_each(step)
            return
        self._take(step.tokens, step.logprobs)
        if self.finish is None and (self.channel.quiet or not deliver):
            if self.text.stop_strings:  # released step by step all the same: each stop-string
                self._held.append(self.text.release(final=False))  # search covers new text only
            return
        self._deliver(self._event(step))

    def _take_each(self, step: _core.StepResult) -> None:
        """``take_step`` one token at a time, an event for each (``per_token``): its own
        logprobs and timings, and the text it made final (none where a stop string may
        still begin, all that is left at the end)."""
        for i, token in enumerate(step.tokens):
            n = len(self.tokens)
            self._take([token], step.logprobs[i : i + 1])
            kept = len(self.tokens) > n  # not an end-of-generation token
            text, _ = self.text.release(final=self.finish is not None)
            self.n_released = len(self.tokens)  # each token is handed with its own event
            lps = None if self.logprobs is None or not kept else [self.logprobs[-1]]
            first = i == 0  # the step's counts ride on its first token's event
            self._deliver(
                StreamStep(
                    tokens=[token] if kept else [],
                    logprobs=lps,
                    text=text,
                    n_drafted=step.n_drafted if first else 0,
                    n_accepted=step.n_accepted if first else 0,
                    drafted=list(step.drafted) if first else [],
                    finish_reason=self.finish,
                    source=step.source,
                    draft_max=step.draft_max,
                    timings=self.timings() if self.timings_per_token else None,
                )
            )
            if self.finish is not None:
                return

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self.channel.put(exc)

    def _deliver(self, event: StreamStep) -> None:
        if self.finish is not None:
            self.decode_s = time.perf_counter() - self.t_decode
            self.done = True
        self.channel.put(event)

    def _take(self, new: list[int], logprobs: Sequence[_core.TokenLogprob]) -> None:
        """Apply EOS, max_tokens and stop strings to one step's tokens."""
        for i, t in enumerate(new):
            if not self.config.ignore_eos and self.model.is_eog(t):
                self.finish = "eos"
                break
            self.tokens.append(t)
            if self.logprobs is not None:
                self.logprobs.append(TokenLogprob.from_core(logprobs[i]))
            self.text.add(t)
            if self.tokens_left <= 0:
                self.finish = "length"
                break
        self._cut_at_stop()

    def _cut_at_stop(self) -> None:
        if self.text.stop_strings:
            keep = self.text.find_stop(final=self.finish is not None)
            if keep is not None:
                del self.tokens[keep:]
                if self.logprobs is not None:
                    del self.logprobs[keep:]
                self.finish = "stop"

    def _event(self, step: _core.StepResult | None) -> StreamStep:
        text, n_new = self.text.release(final=self.finish is not None)
        if self._held:  # released while its reader waited for the end only (take_step)
            text = "".join(t for t, _ in self._held) + text
            n_new += sum(n for _, n in self._held)
            self._held.clear()
        released = self.tokens[self.n_released : self.n_released + n_new]
        logprobs = None if self.logprobs is None else self.logprobs[self.n_released : self.n_released + n_new]
        self.n_released += n_new
        return StreamStep(
            tokens=released,
            logprobs=logprobs,
            text=text,
            n_drafted=step.n_drafted if step else 0,
            n_accepted=step.n_accepted if step else 0,
            drafted=list(step.drafted) if step else [],
            finish_reason=self.finish,
            source=step.source if step else "",
            draft_max=step.draft_max if step else 0,
            timings=self.timings() if self.timings_per_token else None,
        )

    def result(self) -> GenerationResult:
        """The finished generation's text, tokens, finish reason and stats."""
        stats = GenerationStats(
            prompt_tokens=len(self.prompt),
            n_tokens=len(self.tokens),
            n_steps=len(self.steps),
            n_drafted=self.n_drafted,
            n_accepted=self.n_accepted,
            prefill_seconds=self.prefill_s,
            decode_seconds=self.decode_s,
            steps=tuple(self.steps),
            cached_tokens=self.n_cached,
        )
        assert self.finish is not None
        return GenerationResult(
            text=self.text.text(),
            tokens=list(self.tokens),
            finish_reason=self.finish,
            stats=stats,
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )

    def usage(self) -> CompletionUsage:
        """OpenAI's token counts."""
        n_prompt, n_gen = len(self.prompt), len(self.tokens)
        return {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}

    def timings(self) -> Timings:
        """llama-server's: prompt_n counts the prompt tokens evaluated, cache_n
        those taken from the prompt cache; as they stand now, while it runs."""
        n_p, n_g = self.n_prompt_done, len(self.tokens)
        decode_s = self.decode_s or (time.perf_counter() - self.t_decode if self.t_decode else 0.0)
        p_ms, g_ms = self.prefill_s * 1e3, decode_s * 1e3
        # llama-server's rate is over the tokens after the first, which it counts as the prompt's
        n_rate = max(n_g - 1, 0)
        return {
            "cache_n": self.n_cached,
            "prompt_n": n_p,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_p if n_p else 0.0,
            "prompt_per_second": n_p / self.prefill_s if self.prefill_s > 0 else 0.0,
            "predicted_n": n_g,
            "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / n_rate if n_rate else 0.0,
            "predicted_per_second": n_rate / decode_s if decode_s > 0 else 0.0,
            "draft_n": self.n_drafted,
            "draft_n_accepted": self.n_accepted,
            "n_steps": len(self.steps),
        }

    def speculative(self) -> SpeculativeStats:
        """The draft counts of each step and of each draft source."""
        return {
            "accepted_lengths": [s.n_accepted for s in self.steps],
            "draft_sources": {
                k: {"n_drafts": v.n_drafts, "draft_n": v.n_drafted, "draft_n_accepted": v.n_accepted}
                for k, v in by_source(self.steps).items()
            },
        }
