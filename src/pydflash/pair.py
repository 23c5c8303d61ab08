"""The low-level, step-by-step API: a target context and a DFlash drafter
context driven one speculative step at a time.

    pair = llm.pair
    pair.prefill(llm.tokenize("def fib(n):"))
    step = pair.step(draft_max=8)
    step.tokens, step.n_drafted, step.n_accepted, step.t_verify_ms
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import _core, _logging
from .config import Grammar, SamplingConfig, float_option, int_option
from .results import StepResult

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["ContextPair", "StepResult"]

_DRAFT = _core.DraftControl()  # the core's draft-length defaults


class ContextPair:
    """Target + drafter contexts, seen through one sequence's token history
    (``llm.pair`` is sequence 0; ``sequence(i)`` another of ``n_parallel``).

    ``prefill`` clears the sequence's caches and evaluates a prompt (its last
    token is kept pending); each ``step`` drafts a block, verifies it in one
    target pass, keeps the agreeing prefix plus the target's own next token,
    rolls both caches back past it and injects the target features of the
    kept positions into the drafter. Sampling is set with ``set_sampling``
    (greedy by default). Do not step a sequence that a running generation
    (``generate``/``stream``/``submit``) is using."""

    def __init__(self, core: _core.ContextPair, seq: int = 0):
        self._core = core
        self._seq = seq

    def sequence(self, seq: int) -> ContextPair:
        """The same contexts seen through sequence ``seq`` (0 <= seq < n_parallel)."""
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < self._core.n_seq:
            raise ValueError(f"seq must be an int in [0, {self._core.n_seq}), got {seq!r}")
        return ContextPair(self._core, seq)

    @property
    def seq(self) -> int:
        """The sequence this view steps."""
        return self._seq

    def prefill(self, tokens: Sequence[int], *, reuse: bool = False) -> float:
        """Evaluate ``tokens`` from empty caches; returns the time spent in ms.
        With ``reuse``, the longest prefix of ``tokens`` that both caches
        already hold is kept and only the rest is evaluated (``n_cached`` says
        how many were kept; a recurrent target keeps its state only when the
        prompt extends the whole history)."""
        try:
            return self._core.prefill(list(tokens), bool(reuse), self._seq)
        finally:
            _logging.flush()

    def step(
        self,
        draft_max: int | None = None,
        *,
        draft_min: int = _DRAFT.draft_min,
        draft_p_min: float = _DRAFT.draft_p_min,
        draft: Sequence[int] | None = None,
    ) -> StepResult:
        """One speculative step. ``draft_max`` bounds the drafted block (None:
        the pair's default; 0: plain target decoding, no n-gram draft either; past
        ``max_draft``: clamped to it with a warning, as llama.cpp); a block shorter than
        ``draft_min`` is dropped; the block is cut where the drafter's
        confidence falls below ``draft_p_min`` (as llama.cpp measures it: for
        DFlash, the token's softmax probability among the drafter's 10 largest logits). ``draft`` verifies these tokens
        instead of the drafter's block (any external draft source)."""
        dm = -1 if draft_max is None else int_option("draft_max", draft_max, 0)
        limit = self._core.max_draft
        if limit > 0 and dm > limit and draft is None and self._core.drafter_kind != "mtp":
            # as llama.cpp does with a --draft-max past the block: the drafter cannot fill more
            warnings.warn(
                f"draft_max={dm} exceeds the most this drafter drafts in one pass (max_draft={limit}, "
                f"block size {self._core.block_size}); clamped to {limit}",
                stacklevel=2,
            )
            dm = limit
        try:
            return self._core.step(
                dm,
                int_option("draft_min", draft_min),
                float_option("draft_p_min", draft_p_min),
                None if draft is None else list(draft),
                self._seq,
                0 if dm == 0 else -1,  # the budget: 0 drafts nothing from any source
            )
        finally:
            _logging.flush()

    def score(self, tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """The target's logits for every position of ``tokens`` as a numpy array
        (len(tokens), n_vocab), evaluated from an empty cache. Resets the pair."""
        try:
            return self._core.score(list(tokens))
        finally:
            _logging.flush()

    def check_draft(self, config: SamplingConfig) -> None:
        """ValueError unless ``config``'s draft-length options suit this pair
        (``draft_max`` within the drafter's block); nothing is decoded."""
        self._core.check(config.draft_control())

    def set_sampling_config(self, config: SamplingConfig, seed: int) -> None:
        """Set sampling from an already validated ``SamplingConfig`` (the
        generation loop's way), with the seed this run uses, and its grammar."""
        self._core.set_sampling(config.core_params(seed), self._seq)
        self.set_grammar(config.grammar)

    def set_grammar(self, grammar: Grammar | None) -> None:
        """The grammar the next tokens follow, from its start (None: none). Drafted
        tokens it rejects are rejected at verification; only emitted tokens advance it."""
        if grammar is None:
            self._core.set_grammar("", seq=self._seq)
            return
        self._core.set_grammar(
            grammar.gbnf,
            lazy=grammar.lazy,
            trigger_patterns=list(grammar.trigger_patterns),
            trigger_tokens=list(grammar.trigger_tokens),
            prefill=list(grammar.prefill),
            seq=self._seq,
        )

    def set_sampling(
        self,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        *,
        min_p: float = 0.0,
        typical_p: float = 1.0,
        top_n_sigma: float = -1.0,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        penalty_last_n: int = 64,
        logit_bias: Mapping[int, float] | None = None,
        seed: int = 0,
        verify: str = "rejection",
    ) -> None:
        """How the target's tokens are chosen (temperature 0: greedy) and how
        drafts are verified at temperature > 0: "rejection" (speculative
        sampling, exact for the target's distribution), "match" (accept a
        draft only when the target's own sample equals it) or "coupled" (both
        take the Gumbel-max of noise keyed by seed, position and token: the
        target alone's tokens for the seed, whatever drafted). It also drops any
        grammar (``set_grammar`` after it constrains the output)."""
        cfg = SamplingConfig.build(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            top_n_sigma=top_n_sigma,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            penalty_last_n=penalty_last_n,
            logit_bias=logit_bias,
            verify=verify,
        )
        self._core.set_sampling(cfg.core_params(seed), self._seq)
        self._core.set_grammar("", seq=self._seq)

    def interrupt(self) -> None:
        """Stop the running (or the next) decode from any thread; that call
        raises GenerationInterrupted and the pair is reset."""
        self._core.interrupt()

    def reset(self) -> None:
        """Clear this sequence's caches and token history."""
        self._core.reset(self._seq)

    @property
    def n_past(self) -> int:
        """Tokens in the target cache (the pending token is not counted)."""
        return self._core.n_past(self._seq)

    @property
    def n_cached(self) -> int:
        """Prompt tokens the last prefill took from the cache."""
        return self._core.n_cached(self._seq)

    @property
    def n_ctx(self) -> int:
        """One sequence's context: the model's n_ctx / n_parallel."""
        return self._core.n_ctx_seq

    @property
    def n_parallel(self) -> int:
        """Sequences the contexts hold."""
        return self._core.n_seq

    @property
    def tokens(self) -> list[int]:
        """The token history: cached tokens plus the pending one."""
        return self._core.tokens(self._seq)

    @property
    def has_drafter(self) -> bool:
        """Whether a drafter model is loaded (False: the target alone, or MTP / n-gram drafting only)."""
        return self._core.has_drafter

    @property
    def block_size(self) -> int:
        """The drafter's trained block size (0 without a drafter)."""
        return self._core.block_size

    @property
    def max_draft(self) -> int:
        """Largest model draft a step can propose: block_size - 1 (an anchor-first
        DSpark drafter: block_size; an MTP head: its length, fixed at creation)."""
        return self._core.max_draft

    @property
    def drafter_kind(self) -> str:
        """ "dflash", "dflash2" (selector lattice: tokens only, verified with a
        one-hot q), "dspark" (Markov + confidence heads), "mtp" (the target's own
        next-token-prediction head, speculative 'draft-mtp'), or "" without a drafter."""
        return self._core.drafter_kind

    @property
    def drafter_description(self) -> str:
        """The kind and its variant, e.g. "dflash2 (selector top-k 4)" or
        "dflash (d2t vocabulary 200)" for a reduced-vocabulary drafter."""
        return self._core.drafter_description

    @property
    def default_draft_max(self) -> int:
        """The draft length ``step(draft_max=None)`` uses: the pair's ``draft_max``, else block size - 1."""
        return self._core.default_draft_max

    @property
    def draft_pass_rows(self) -> int:
        """Rows of one sequence's drafter pass, whatever a step keeps of the block
        (0: no pass of fixed size, as an MTP head drafts token by token)."""
        return self._core.draft_pass_rows

    @property
    def draft_window(self) -> int:
        """Positions before a block whose features the drafter sees (its window:
        ``draft_window`` or the drafter's own sliding window); 0: the whole context."""
        return self._core.draft_window

    @property
    def target_layer_ids(self) -> list[int]:
        """The target layers whose inputs feed the drafter (llama.cpp's ids, from ``dflash.target_layers``)."""
        return self._core.target_layer_ids

    @property
    def rollback(self) -> str:
        """How rejected draft tokens leave the target's memory: "kv-trim"
        (attention-only targets), "recurrent-planes" (hybrid targets whose
        llama.cpp architecture keeps per-token state planes, e.g. qwen35) or
        "checkpoint" (other recurrent/hybrid targets: save the state before
        verifying, restore it and replay the accepted tokens)."""
        return self._core.rollback

    @property
    def n_rs_seq(self) -> int:
        """Recurrent-state planes of the target: the deepest rollback without a
        checkpoint (0 unless rollback is "recurrent-planes")."""
        return self._core.n_rs_seq

    def __repr__(self) -> str:
        return (
            f"<pydflash.ContextPair seq={self._seq} n_past={self.n_past} n_ctx={self.n_ctx} "
            f"block_size={self.block_size} drafter={self.has_drafter} rollback={self.rollback}>"
        )
