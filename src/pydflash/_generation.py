"""The generation loop: one prompt, speculative steps until EOS, a stop
string, ``max_tokens`` or a full context. ``Llama.generate``/``stream`` and
the OpenAI-style completions (and through them the server) all run it.

It needs only what ``GenerationHost`` names (``Llama`` provides it), so this
module imports nothing that imports it back."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from . import _core, _logging
from ._text import TextAssembler
from .config import ModelConfig, SamplingConfig
from .errors import GenerationInterrupted
from .openai_types import CompletionUsage, Timings
from .pair import ContextPair
from .results import FinishReason, GenerationResult, GenerationStats, StreamStep, TokenLogprob

__all__ = ["Generation", "GenerationHost", "Prompt"]

Prompt = str | Sequence[int]


class GenerationHost(Protocol):
    """What a generation needs from the object that owns the model (``Llama``)."""

    @property
    def config(self) -> ModelConfig: ...

    @property
    def pair(self) -> ContextPair: ...

    @property
    def core_model(self) -> _core.Model: ...

    def prompt_tokens(self, prompt: Prompt) -> list[int]: ...

    def exclusive(self) -> AbstractContextManager[None]: ...


class Generation:
    """One generation of ``config`` after ``prompt``; iterate it for one
    ``StreamStep`` per speculative step (the last carries the finish reason).

    The prompt is tokenized and the draft options checked against the pair
    here, before anything runs; the model is held (``host.exclusive()``) while
    the iteration runs. After it: ``tokens``, ``steps`` (the core's step
    results), ``prefill_s``/``decode_s``, ``n_cached``, ``finish`` and
    ``result()``, ``usage()``, ``timings()``."""

    def __init__(self, host: GenerationHost, prompt: Prompt, config: SamplingConfig):
        self.host = host
        self.config = config
        self.prompt: list[int] = host.prompt_tokens(prompt)
        model = host.core_model
        host.pair.check_draft(config)  # before any work: draft_max within the block
        self.model = model
        self.text = TextAssembler(lambda t: model.token_to_piece(t, False), config.stop)
        self.tokens: list[int] = []
        # one per token, in step with self.tokens, with logprobs=True
        self.logprobs: list[TokenLogprob] | None = [] if config.logprobs else None
        self.n_released = 0  # tokens already handed to a stream consumer
        self.steps: list[_core.StepResult] = []
        self.finish: FinishReason | None = None
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.n_cached = 0  # prompt tokens taken from the prompt cache

    def __iter__(self) -> Iterator[StreamStep]:
        return self._loop()

    def run(self, cancel: Callable[[], bool] | None = None) -> Generator[StreamStep, None, None]:
        """The steps; ``cancel()`` (when given) is asked after each unfinished
        one, and True stops the generation with ``GenerationInterrupted``."""
        it = self._loop()
        try:
            for step in it:
                yield step
                if cancel is not None and step.finish_reason is None and cancel():
                    raise GenerationInterrupted("the generation was cancelled")
        finally:
            it.close()  # a consumer that stops early ends the generation (and frees the model) now

    def _loop(self) -> Generator[StreamStep, None, None]:
        with self.host.exclusive():
            try:
                yield from self._decode()
            finally:
                _logging.flush()

    def _decode(self) -> Generator[StreamStep, None, None]:
        host, cfg = self.host, self.config
        pair = host.pair
        seed = cfg.seed if cfg.seed is not None else host.config.seed
        if seed < 0:
            seed = random.getrandbits(63)
        pair.set_sampling_config(cfg, seed)
        t0 = time.perf_counter()
        pair.prefill(self.prompt, reuse=cfg.cache_prompt)
        self.prefill_s = time.perf_counter() - t0
        self.n_cached = pair.n_cached
        draft_max = cfg.draft_max
        t0 = time.perf_counter()
        while self.finish is None:
            remaining = cfg.max_tokens - len(self.tokens)
            if remaining <= 0 or pair.n_past >= pair.n_ctx:
                self.finish = "length"
                self._cut_at_stop()
                yield self._event(None)
                break
            dm = remaining - 1 if draft_max is None else min(draft_max, remaining - 1)
            if draft_max is None:
                dm = min(dm, pair.default_draft_max)
            step = host.pair.step(dm, draft_min=cfg.draft_min, draft_p_min=cfg.draft_p_min)
            self.steps.append(step)
            self._take(step.tokens, step.logprobs)
            yield self._event(step)
        self.decode_s = time.perf_counter() - t0

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
            if len(self.tokens) >= self.config.max_tokens:
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
        )

    def result(self) -> GenerationResult:
        """The finished generation's text, tokens, finish reason and stats."""
        stats = GenerationStats(
            prompt_tokens=len(self.prompt),
            n_tokens=len(self.tokens),
            n_steps=len(self.steps),
            n_drafted=sum(s.n_drafted for s in self.steps),
            n_accepted=sum(s.n_accepted for s in self.steps),
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
        those taken from the prompt cache."""
        n_p, n_g = len(self.prompt) - self.n_cached, len(self.tokens)
        p_ms, g_ms = self.prefill_s * 1e3, self.decode_s * 1e3
        return {
            "cache_n": self.n_cached,
            "prompt_n": n_p,
            "prompt_ms": p_ms,
            "prompt_per_token_ms": p_ms / n_p if n_p else 0.0,
            "prompt_per_second": n_p / self.prefill_s if self.prefill_s > 0 else 0.0,
            "predicted_n": n_g,
            "predicted_ms": g_ms,
            "predicted_per_token_ms": g_ms / n_g if n_g else 0.0,
            "predicted_per_second": n_g / self.decode_s if self.decode_s > 0 else 0.0,
            "draft_n": sum(s.n_drafted for s in self.steps),
            "draft_n_accepted": sum(s.n_accepted for s in self.steps),
            "n_steps": len(self.steps),
            "accepted_lengths": [s.n_accepted for s in self.steps],
        }
