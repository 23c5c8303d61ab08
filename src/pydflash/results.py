"""Immutable result types of a generation."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal, TypedDict

from . import _core
from ._core import StepResult

FinishReason = Literal["length", "stop", "eos"]

__all__ = [
    "CompletionUsage",
    "DraftSourceTimings",
    "FinishReason",
    "GenerationResult",
    "GenerationStats",
    "MemoryReport",
    "MemoryRow",
    "PromptProgress",
    "SourceStats",
    "SpeculativeStats",
    "StepResult",
    "StreamStep",
    "Timings",
    "TokenLogprob",
]


@dataclasses.dataclass(frozen=True)
class SourceStats:
    """What one draft source proposed and what the target kept: "draft-dflash",
    an n-gram type of llama.cpp's --spec-type list, or "external"."""

    n_drafts: int  # steps whose draft it made
    n_drafted: int
    n_accepted: int

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens of this source (0.0 when it drafted nothing)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0


def by_source(steps: Sequence[StepResult]) -> dict[str, SourceStats]:
    """Steps' drafts and accepted tokens summed per source."""
    acc: dict[str, list[int]] = {}
    for s in steps:
        if s.source:
            a = acc.setdefault(s.source, [0, 0, 0])
            a[0] += 1
            a[1] += s.n_drafted
            a[2] += s.n_accepted
    return {k: SourceStats(*v) for k, v in acc.items()}


@dataclasses.dataclass(frozen=True)
class GenerationStats:
    """What one generation cost and how well the drafter did."""

    prompt_tokens: int
    n_tokens: int  # generated tokens returned to the caller
    n_steps: int  # target verification passes
    n_drafted: int
    n_accepted: int
    prefill_seconds: float
    decode_seconds: float
    steps: Sequence[StepResult] = dataclasses.field(repr=False)
    cached_tokens: int = 0  # prompt tokens taken from the prompt cache (not prefilled)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0.0 when nothing was drafted)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def draft_lengths(self) -> tuple[int, ...]:
        """The draft length each step asked for (chosen by the adaptive policy, or the
        pinned draft_max, as the block, context and max_tokens allowed; 0: plain decoding)."""
        return tuple(s.draft_max for s in self.steps)

    @property
    def mean_accepted_length(self) -> float:
        """tau: generated tokens per target verification pass."""
        return self.n_tokens / self.n_steps if self.n_steps else 0.0

    @property
    def by_source(self) -> dict[str, SourceStats]:
        """Drafted and accepted tokens per draft source (steps without a draft are left out)."""
        return by_source(self.steps)

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (after the prompt's prefill)."""
        return self.n_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        """Prompt tokens evaluated (those not taken from the cache) per second."""
        n = self.prompt_tokens - self.cached_tokens
        return n / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def draft_seconds(self) -> float:
        """Time in drafter passes, summed over the steps."""
        return sum(s.t_draft_ms for s in self.steps) / 1e3

    @property
    def verify_seconds(self) -> float:
        """Time in target verification passes, summed over the steps."""
        return sum(s.t_verify_ms for s in self.steps) / 1e3

    @property
    def inject_seconds(self) -> float:
        """Time injecting the target's features into the drafter, summed over the steps."""
        return sum(s.t_inject_ms for s in self.steps) / 1e3

    @property
    def rollback_seconds(self) -> float:
        """Removing rejected tokens from the target (checkpoints: save, restore, replay)."""
        return sum(s.t_rollback_ms for s in self.steps) / 1e3


@dataclasses.dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability (natural log) and the ``top`` most
    likely tokens at its position, as (token, logprob), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_core(cls, lp: _core.TokenLogprob) -> TokenLogprob:
        """Build one from the core's record.

        Args:
            lp: The core's ``TokenLogprob``.

        Returns:
            The same token, log-probability and top alternatives, as a frozen dataclass.
        """
        return cls(lp.token, lp.logprob, tuple(lp.top))


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """What ``Llama.generate`` returns: the text and tokens generated, why it stopped, the stats,
    and the log-probabilities when asked for (``logprobs=True``)."""

    text: str
    tokens: list[int]
    finish_reason: FinishReason
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per token, with logprobs=True


@dataclasses.dataclass(frozen=True)
class PromptProgress:
    """How far a prompt's evaluation is (llama-server's ``prompt_progress``): ``total``
    prompt tokens, ``cache`` of them from the prompt cache, ``processed`` (the cached
    ones included) evaluated, ``time_ms`` since the generation was admitted."""

    total: int
    cache: int
    processed: int
    time_ms: int


@dataclasses.dataclass(frozen=True)
class StreamStep:
    """One step of ``Llama.stream``: the tokens it produced (after EOS, stop
    strings and max_tokens are applied) and the text that is now final."""

    tokens: list[int]
    text: str
    n_drafted: int
    n_accepted: int
    drafted: list[int]
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, with logprobs=True
    source: str = ""  # who drafted this step ("draft-dflash", "ngram-mod", ...); "": nobody
    draft_max: int = 0  # the draft length this step asked for (0: plain decoding)
    # a progress event (no tokens), for a generation made with progress=True
    prompt_progress: PromptProgress | None = None
    # the generation's timings at this step, for one made with timings_per_token=True
    timings: Timings | None = None


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    """Bytes one context holds in one buffer type (llama.cpp's breakdown)."""

    role: Literal["target", "drafter"]
    buffer: str  # ggml buffer type: "CPU", "CUDA0", ...
    model: int  # weights
    context: int  # KV cache / recurrent state
    compute: int  # compute buffers

    @property
    def total(self) -> int:
        """Model + context + compute bytes of this row."""
        return self.model + self.context + self.compute


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """``Llama.memory()``: what the target and the drafter hold, per device.
    ``drafter_bytes`` is the drafter's overhead over running the target alone
    (its weights, KV cache, and compute buffers). The context bytes (KV caches,
    recurrent states) are shared by ``n_parallel`` sequences of
    ``n_ctx // n_parallel`` tokens each: ``per_sequence_bytes`` is one
    sequence's share, what one more sequence of that size adds."""

    rows: tuple[MemoryRow, ...]
    n_parallel: int = 1

    @property
    def per_sequence_bytes(self) -> int:
        """One sequence's share of the contexts (KV caches, recurrent state) of both models."""
        return sum(r.context for r in self.rows) // max(1, self.n_parallel)

    def total(self, role: str | None = None) -> int:
        """Bytes of every row, or of one model's rows.

        Args:
            role: ``"target"``, ``"drafter"``, or None for both.

        Returns:
            Model + context + compute bytes summed over the rows.
        """
        return sum(r.total for r in self.rows if role is None or r.role == role)

    @property
    def target_bytes(self) -> int:
        """What the target holds: weights, context and compute buffers."""
        return self.total("target")

    @property
    def drafter_bytes(self) -> int:
        """What the drafter holds: its overhead over the target alone."""
        return self.total("drafter")

    def __str__(self) -> str:
        lines = [f"{'role':8} {'buffer':10} {'model MiB':>10} {'context MiB':>12} {'compute MiB':>12}"]
        for r in self.rows:
            lines.append(
                f"{r.role:8} {r.buffer:10} {r.model / 2**20:10.2f} {r.context / 2**20:12.2f} {r.compute / 2**20:12.2f}"
            )
        if self.n_parallel > 1:
            lines.append(f"{self.n_parallel} sequences: {self.per_sequence_bytes / 2**20:.2f} MiB of context each")
        return "\n".join(lines)


class CompletionUsage(TypedDict):
    """Token counts of a request: prompt, completion and total (OpenAI's ``usage``)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class DraftSourceTimings(TypedDict):
    """One draft source's share of a generation's drafts."""

    n_drafts: int  # steps whose draft it made
    draft_n: int
    draft_n_accepted: int


class Timings(TypedDict):
    """llama-server's ``timings`` object (numbers only, as its clients read it), plus the
    DFlash step count."""

    cache_n: int  # prompt tokens taken from the prompt cache
    prompt_n: int  # prompt tokens evaluated
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    draft_n: int  # tokens the drafter proposed
    draft_n_accepted: int  # of those, tokens the target accepted
    n_steps: int  # target verification passes


class SpeculativeStats(TypedDict):
    """pydflash's ``speculative`` object, beside ``timings``: the per-step and per-source
    draft counts (lists and objects, which llama-server's ``timings`` never holds)."""

    accepted_lengths: list[int]  # accepted draft tokens of each step
    draft_sources: dict[str, DraftSourceTimings]  # per source: "draft-dflash", "ngram-mod", ...
