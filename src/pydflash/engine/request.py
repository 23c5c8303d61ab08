"""``Request``: one generation's request, built and checked once, in the caller's
thread, then read (never written) by the engine and the output processor.

Everything a caller decides is here: the prompt's token ids, the sampling config (its
seed resolved), the slot, the token budget, the stop strings, the logprob settings and
the events its reader asked for. What the engine does with it (its slot, position,
draft-length state, tokens counted so far) is the engine's own (``engine._Running``);
what comes of it (text, stop strings, logprobs, stats) is the output processor's
(``generation.Generation``)."""

from __future__ import annotations

import dataclasses
import random

from ..config import ModelConfig, SamplingConfig
from ..errors import ContextLimitError
from ..pair import ContextPair

__all__ = ["Request", "make_request"]


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One generation's immutable request (see the module docstring)."""

    prompt: tuple[int, ...]
    config: SamplingConfig  # verify=None resolved for the seed (SamplingConfig.for_seed)
    seed: int  # >= 0: a random one drawn where the caller gave -1
    slot: int | None  # None: the engine picks
    max_tokens: int  # the token budget: max_tokens, or what one sequence's context leaves
    n_ctx: int  # one sequence's context
    adaptive: bool  # the engine chooses each step's draft length (draft_length/)
    stop: tuple[str, ...] = ()  # the stop strings (searched by the output processor, off the engine's thread)
    progress: bool = False  # llama-server's return_progress: prompt-progress events
    timings_per_token: bool = False  # each event carries the timings as they stand
    per_token: bool = False  # one event per token (llama-server's native stream)

    @property
    def logprobs(self) -> bool:
        return bool(self.config.logprobs)


def make_request(
    prompt: list[int],
    config: SamplingConfig,
    pair: ContextPair,
    model_config: ModelConfig,
    *,
    slot: int | None = None,
    progress: bool = False,
    timings_per_token: bool = False,
    per_token: bool = False,
) -> Request:
    """The checked request: the prompt's length against one sequence's context, the slot,
    the draft options against the pair; the seed drawn where it is random."""
    limit = pair.n_ctx  # one sequence's context
    if len(prompt) > limit - 1:
        where = f"a sequence's context holds {limit}" if pair.n_parallel > 1 else f"the context holds {limit}"
        raise ContextLimitError(
            f"prompt has {len(prompt)} tokens but {where} (at most {limit - 1} prompt tokens leave room to generate)",
            n_prompt_tokens=len(prompt),
            n_ctx=limit,
        )
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not -1 <= slot < pair.n_parallel):
        raise ValueError(f"slot must be -1 or an int in [0, {pair.n_parallel}), got {slot!r}")
    pair.check_draft(config)  # before any work: draft_max within the block
    seed = config.seed if config.seed is not None else model_config.seed
    drawn = seed if seed >= 0 else random.getrandbits(63)
    config = config.for_seed(seed >= 0)  # verify=None: "coupled" when seeded
    # the engine chooses each step's draft length (draft_length/) unless one is pinned
    # (here or by the Llama), adaptive lengths are off, or a seeded sample must
    # reproduce: its random draws follow the draft lengths, which follow timings
    # (verify="coupled" draws none: its noise is keyed by position, any length reproduces)
    sampled_with_seed = config.temperature > 0 and config.top_k != 1 and seed >= 0 and config.verify != "coupled"
    adaptive = (
        (pair.has_drafter or pair.drafter_kind == "mtp")
        and config.draft_max is None
        and model_config.draft_max is None
        and model_config.draft_adaptive
        and not sampled_with_seed
    )
    n = config.max_tokens
    return Request(
        prompt=tuple(prompt),
        config=config,
        seed=drawn,
        slot=None if slot is None or slot < 0 else slot,
        max_tokens=limit - len(prompt) if n is None else n,
        n_ctx=limit,
        adaptive=adaptive,
        stop=tuple(s for s in config.stop if s),
        progress=progress,
        timings_per_token=timings_per_token,
        per_token=per_token,
    )
