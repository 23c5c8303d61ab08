"""One generation as its reader sees it: the request, and the output processor that
turns the engine's raw step results into what comes of it.

The caller builds and checks the immutable ``Request`` in its own thread
(``request.make_request``) and hands it over: ``Generation(host, request)``. Iterating
it (or ``wait()``, ``async for``, ``await_end()``) submits it to the host's engine
(``Engine.submit`` returns a ``RequestHandle``). The engine thread only sends raw
``EngineOutput``s (token ids, logprobs, per-step draft counts, its clock); here, on the
reader's side, they become text (``TextAssembler``), stop-string hits (which abort the
request in the engine: the tokens past the stop are cut), logprobs, ``StreamStep``s and
the ``GenerationResult``. ``Llama.generate``/``stream``/``submit`` and the OpenAI-style
completions (and through them the server) all use it.

It needs only what ``GenerationHost`` names (``Llama`` provides it), so this
module imports nothing that imports it back."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from typing import Protocol

from .. import _core
from ..errors import GenerationInterrupted
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
from .channel import Channel, Clock, EngineOutput, Item, RequestHandle, output_or_raise
from .request import Request
from .text import TextAssembler
from .watcher import WATCHER

__all__ = ["Generation", "GenerationHost", "Prompt"]

Prompt = str | Sequence[int]

CANCEL_POLL_S = 0.1  # how often a caller that waits for the end asks its cancel check


class GenerationHost(Protocol):
    """What a generation needs from the object that owns the model (``Llama``)."""

    @property
    def core_model(self) -> _core.Model: ...

    def submit_request(
        self, request: Request, quiet: bool = False, cancel_check: Callable[[], bool] | None = None
    ) -> RequestHandle: ...


class Generation:
    """One generation of ``request``; iterate it (or ``async for``) for one
    ``StreamStep`` per speculative step, or per run of plain steps that the engine
    took in one call (the last carries the finish reason). Iterating submits it to
    the host's engine; leaving the iteration early cancels it.

    The request comes checked (``request.make_request``, in the caller's thread,
    before anything runs). After it: ``tokens``, ``steps`` (the core's step results),
    ``prefill_s``/``decode_s``, ``n_cached``, ``finish`` and ``result()``, ``usage()``,
    ``timings()``."""

    def __init__(self, host: GenerationHost, request: Request):
        if not isinstance(request, Request):
            raise TypeError(f"a Generation runs a Request (engine.request.make_request), not {type(request).__name__}")
        self.host = host
        self.request = req = request
        self.prompt: list[int] = list(req.prompt)
        self.config = req.config
        self.model = model = host.core_model
        self.text = TextAssembler(lambda t: model.token_to_piece(t, False), req.stop)
        self.tokens: list[int] = []
        # one per token, in step with self.tokens, with logprobs=True
        self.logprobs: list[TokenLogprob] | None = [] if req.logprobs else None
        self.n_released = 0  # tokens already handed to a stream consumer
        self._held: list[tuple[str, int]] = []  # text and tokens released, not handed yet
        self._hold = False  # its reader waits for the end only: one event, at the end
        self.steps: list[_core.StepResult] = []
        self.n_drafted = self.n_accepted = 0  # over its steps (timings() is read after each, per token)
        self.finish: FinishReason | None = None
        self.decode_s = 0.0
        self._clock = Clock()
        self._handle: RequestHandle | None = None
        self._error: BaseException | None = None  # what ended it while run_all read it
        self._ready: list[StreamStep] = []  # events run_all or the watcher made, for its reader
        self._lock = threading.Lock()  # the watcher's processing, or a reader's claim
        self._watched = False  # the watcher processes its outputs until a reader claims it
        self.cancel_check: Callable[[], bool] | None = None
        self.t_submit = 0.0

    # -- what the request fixed, and the engine's clock as its last output gave it

    @property
    def slot(self) -> int | None:
        return self.request.slot

    @property
    def seed(self) -> int:
        return self.request.seed

    @property
    def n_ctx(self) -> int:
        return self.request.n_ctx

    @property
    def per_token(self) -> bool:
        return self.request.per_token

    @property
    def timings_per_token(self) -> bool:
        return self.request.timings_per_token

    @property
    def max_tokens(self) -> int:
        """Its token budget: ``max_tokens``, or (None) what the context has left after
        the prompt (llama-cpp-python's ``max_tokens=None``, llama-server's ``n_predict`` -1)."""
        return self.request.max_tokens

    @property
    def tokens_left(self) -> int:
        return self.request.max_tokens - len(self.tokens)

    @property
    def n_cached(self) -> int:
        """Prompt tokens taken from the prompt cache."""
        return self._clock.n_cached

    @property
    def prefill_s(self) -> float:
        return self._clock.prefill_s

    @property
    def submitted(self) -> bool:
        return self._handle is not None

    @property
    def done(self) -> bool:
        """Finished, failed or cancelled (the engine is through with it, or its reader is)."""
        return self.finish is not None or (self._handle is not None and self._handle.done)

    @property
    def cancelled(self) -> bool:
        """The engine dropped it (a cancel, or its reader left) rather than finishing it."""
        return self._handle is not None and self._handle.cancelled

    @property
    def channel(self) -> Channel | None:
        return None if self._handle is None else self._handle.channel

    # -- the reader's side -------------------------------------------------------

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
        asleep until then rather than woken for each step (where it has stop strings, woken
        per step to search them, its events still held to the end); its steps not read yet
        (one, with everything, where nothing read it before), or its error. ``cancel()``
        (when given) is asked every CANCEL_POLL_S seconds once it runs (while it waits
        for a slot only the engine asks, as it admits it): True stops it with
        ``GenerationInterrupted``. Ctrl-C while waiting cancels it, as leaving an
        iteration does."""
        self.cancel_check = cancel  # the engine also asks it before the prompt is evaluated
        events = self._claim()
        self._hold = True  # from its first step
        quiet = not self.text.stop_strings
        handle = self.submit(quiet)
        poll = None if cancel is None else CANCEL_POLL_S
        next_ask = time.monotonic() + CANCEL_POLL_S
        try:
            while self.finish is None:
                got = handle.wait(poll) if quiet else _listed(handle.channel.get(poll))
                for out in got or ():
                    events += self._process(out, deliver=False)
                if cancel is not None and handle.admitted and self.finish is None and time.monotonic() >= next_ask:
                    next_ask = time.monotonic() + CANCEL_POLL_S
                    if cancel():  # admitted: the engine asked first
                        raise GenerationInterrupted("the generation was cancelled")
            return events
        finally:
            self.cancel()

    async def await_end(self) -> list[StreamStep]:
        """``wait()`` for asyncio, without blocking the event loop; a task that stops
        awaiting (cancelled) cancels the generation."""
        events = self._claim()
        self._hold = True
        quiet = not self.text.stop_strings
        handle = self.submit(quiet)
        try:
            if self.finish is not None:
                pass
            elif quiet:
                for out in await handle.await_end():
                    events += self._process(out, deliver=False)
            else:
                async for out in handle:
                    events += self._process(out, deliver=False)
                    if self.finish is not None:
                        break
            return events
        finally:
            self.cancel()

    @staticmethod
    def run_all(gens: Sequence[Generation], cancel: Callable[[], bool] | None = None) -> None:
        """Run them all to the end in one thread, each one's outputs processed as they come
        (a reader that reads them one after the other would leave the stop strings of all
        but the first unsearched, and those generations running past them), asleep between;
        then each one's ``wait()`` returns at once (or raises the error that ended it).
        ``cancel()``, as ``wait``'s, is asked every CANCEL_POLL_S seconds once one runs:
        True cancels them all with ``GenerationInterrupted``."""
        bell = threading.Event()
        for g in gens:
            with g._lock:  # taken over from the watcher (a Submission's)
                g._watched = False
            g._hold = True
            g.cancel_check = cancel
            g.submit(not g.text.stop_strings).channel.bell = bell
        pending = list(gens)
        next_ask = time.monotonic() + CANCEL_POLL_S
        try:
            while True:
                bell.clear()  # before reading: an output put after this sets it again
                if not (pending := [g for g in pending if not g._pump()]):
                    return
                bell.wait(None if cancel is None else CANCEL_POLL_S)
                running = any(g._handle is not None and g._handle.admitted for g in pending)
                if cancel is not None and running and time.monotonic() >= next_ask:
                    next_ask = time.monotonic() + CANCEL_POLL_S
                    if cancel():
                        raise GenerationInterrupted("the generation was cancelled")
        except BaseException:
            for g in gens:
                g.cancel()
            raise

    def watch(self) -> None:
        """Have the watcher process its outputs as they come until a reader claims it
        (``watcher.py``): where it has stop strings, which would otherwise go unsearched,
        and it running past them, until it is read. Call after ``submit()``."""
        if self.text.stop_strings and self._handle is not None and self.finish is None:
            self._watched = True
            WATCHER.watch(self._handle.channel, self._pump_watched)

    def _pump_watched(self) -> bool:
        with self._lock:
            if not self._watched:  # claimed by a reader
                return True
            ended = self._pump()
            self._watched = not ended
            return ended

    def _claim(self) -> list[StreamStep]:
        """Its reader takes it over from the watcher (or from run_all): the events made
        for it meanwhile, or the error that ended it."""
        with self._lock:
            self._watched = False
            if self._error is not None:
                raise self._error
            events, self._ready = self._ready, []
            return events

    def _pump(self) -> bool:
        """Process every output in its channel now, without waiting; True where it ended."""
        assert self._handle is not None
        try:
            while self.finish is None and (item := self._handle.channel.get(0)) is not None:
                self._ready += self._process(output_or_raise(item), deliver=False)
        except Exception as e:  # the error that ended it: its wait() raises it
            self._error = e
        return self.finish is not None or self._error is not None

    def submit(self, quiet: bool = False) -> RequestHandle:
        """Hand it to the engine (once); its outputs then queue for the reader
        (``quiet``: its reader is woken at the end only)."""
        if self._handle is None:
            self.t_submit = time.perf_counter()
            self._handle = self.host.submit_request(self.request, quiet, self.cancel_check)
        else:
            self._handle.cancel_check = self.cancel_check
            if quiet:
                self._handle.channel.quiet = True
        return self._handle

    def cancel(self) -> None:
        """Stop it between steps (or abort its decode when it runs alone); its
        sequence's cache stays valid and a reader gets GenerationInterrupted. No
        effect once done."""
        handle = self._handle
        if handle is not None and not self.done and not handle.cancelled:
            handle.cancel()
            handle.channel.put(GenerationInterrupted("the generation was cancelled"))

    def _consume(self) -> Generator[StreamStep, None, None]:
        handle = self.submit()
        try:
            for step in self._claim():
                yield step
                if step.finish_reason is not None:
                    return
            for out in handle:
                for step in self._process(out, deliver=True):
                    yield step
                    if step.finish_reason is not None:
                        return
        finally:
            self.cancel()

    async def _aconsume(self) -> AsyncIterator[StreamStep]:
        handle = self.submit()
        try:
            for step in self._claim():
                yield step
                if step.finish_reason is not None:
                    return
            async for out in handle:
                for step in self._process(out, deliver=True):
                    yield step
                    if step.finish_reason is not None:
                        return
        finally:
            self.cancel()

    def __aiter__(self) -> AsyncIterator[StreamStep]:
        return self._aconsume()

    # -- the output processor -------------------------------------------------------

    def _process(self, out: EngineOutput, deliver: bool) -> list[StreamStep]:
        """One raw output of the engine into the events it gives (none while they are
        held: ``deliver`` False, or a reader that waits for the end only)."""
        if self.finish is not None:  # ended here (a stop string): what the engine sent since is dropped
            return []
        self._clock = out.clock
        events: list[StreamStep] = []
        if out.processed is not None:
            events.append(self._progress_event(out))
        if not out.steps:
            if out.finish is not None:  # the context is full, or the budget spent, before a step
                self.finish = out.finish
                self._cut_at_stop()
                self._ended(out.t)
                events.append(self._event(None))
            return events
        last = len(out.steps) - 1
        for i, (step, kept) in enumerate(zip(out.steps, out.kept, strict=True)):
            events += self._take_step(step, kept, out.finish if i == last else None, deliver and i == last, out.t)
            if self.finish is not None:
                break
        return events

    def _progress_event(self, out: EngineOutput) -> StreamStep:
        """llama-server's return_progress: an empty step with its prompt_progress."""
        c = out.clock
        ms = int((out.t - c.t_start) * 1e3)
        event = PromptProgress(total=len(self.prompt), cache=c.n_cached, processed=out.processed or 0, time_ms=ms)
        timings = self.timings() if self.timings_per_token else None
        return StreamStep([], "", 0, 0, [], prompt_progress=event, timings=timings)

    def _take_step(
        self, step: _core.StepResult, kept: int, finish: FinishReason | None, deliver: bool, t: float
    ) -> list[StreamStep]:
        """One step's tokens: the engine's count (EOS, the budget), then stop strings;
        an event (to a reader that waits for the end only, one at the end, with every
        token and all the text not delivered before; so too, ``deliver`` False, with the
        next step delivered, where the engine ran several in one call)."""
        self.steps.append(step)
        self.n_drafted += step.n_drafted
        self.n_accepted += step.n_accepted
        if self.per_token and not self._hold:
            return self._take_each(step, kept, finish, t)
        self._take(step.tokens[:kept], step.logprobs)
        self.finish = finish
        self._cut_at_stop()
        if self.finish is None and (self._hold or not deliver):
            if self.text.stop_strings:  # released step by step all the same: each stop-string
                self._held.append(self.text.release(final=False))  # search covers new text only
            return []
        self._ended(t)
        return [self._event(step)]

    def _take_each(self, step: _core.StepResult, kept: int, finish: FinishReason | None, t: float) -> list[StreamStep]:
        """``_take_step`` one token at a time, an event for each (``per_token``): its own
        logprobs and timings, and the text it made final (none where a stop string may
        still begin, all that is left at the end)."""
        n_tok = kept + (1 if finish == "eos" else 0)  # the end-of-generation token has its event
        events: list[StreamStep] = []
        for i, token in enumerate(step.tokens[:n_tok]):
            n = len(self.tokens)
            if i < kept:
                self._take([token], step.logprobs[i : i + 1])
            if i == n_tok - 1:
                self.finish = finish
            self._cut_at_stop()
            taken = len(self.tokens) > n  # not an end-of-generation token
            text, _ = self.text.release(final=self.finish is not None)
            self.n_released = len(self.tokens)  # each token is handed with its own event
            lps = None if self.logprobs is None or not taken else [self.logprobs[-1]]
            first = i == 0  # the step's counts ride on its first token's event
            self._ended(t)
            events.append(
                StreamStep(
                    tokens=[token] if taken else [],
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
                break
        return events

    def _ended(self, t: float) -> None:
        """At its finish: its decode time; a stop string found here aborts it in the engine."""
        if self.finish is None:
            return
        self.decode_s = t - self._clock.t_decode
        if self._handle is not None and not self._handle.done:
            self._handle.abort()

    def _take(self, new: Sequence[int], logprobs: Sequence[_core.TokenLogprob]) -> None:
        for i, t in enumerate(new):
            self.tokens.append(t)
            if self.logprobs is not None:
                self.logprobs.append(TokenLogprob.from_core(logprobs[i]))
            self.text.add(t)

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
        if self._held:  # released while its reader waited for the end only (_take_step)
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

    # -- what came of it -------------------------------------------------------------

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
        c = self._clock
        n_p, n_g = c.n_prompt_done, len(self.tokens)
        decode_s = self.decode_s or (time.perf_counter() - c.t_decode if c.t_decode else 0.0)
        p_ms, g_ms = c.prefill_s * 1e3, decode_s * 1e3
        # llama-server's rate is over the tokens after the first, which it counts as the prompt's
        n_rate = max(n_g - 1, 0)
        return {
            "cache_n": c.n_cached,
            "prompt_n": n_p,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_p if n_p else 0.0,
            "prompt_per_second": n_p / c.prefill_s if c.prefill_s > 0 else 0.0,
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


def _listed(item: Item | None) -> list[EngineOutput] | None:
    return None if item is None else [output_or_raise(item)]
