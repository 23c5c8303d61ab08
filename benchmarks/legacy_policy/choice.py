"""The adaptive draft length's joint choice: the lengths (one per running sequence)
that maximise expected tokens per ms of the step they share (``_draft_policy`` gives
each sequence's expected tokens and rows per length)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .cost import CostModel

__all__ = ["Choice", "best_alone", "choose_lengths", "drafter_rows"]


@dataclasses.dataclass
class Choice:
    """One sequence's part of a joint choice: its allowed lengths and gains."""

    gains: list[float]  # E(0..hi)
    lo: int  # the shortest draft it may take (draft_min; 0 is always allowed)
    hi: int  # the longest (block, context, max_tokens)
    pinned: int | None = None  # a fixed length (not chosen)
    rows: list[float] | None = None  # expected target rows per length (None: 1 + k, no cut)

    def rows_at(self, k: int) -> float:
        return self.rows[min(k, len(self.rows) - 1)] if self.rows is not None else 1 + k

    def options(self) -> list[int]:
        if self.pinned is not None:
            return [self.pinned]
        return [0, *range(max(self.lo, 1), self.hi + 1)]


def choose_lengths(cost: CostModel, choices: Sequence[Choice], pass_rows: int = 0) -> list[int]:
    """The lengths (one per choice) that maximise expected tokens per ms of the
    shared step. A sequence that drafts adds ``pass_rows`` rows to the drafter
    pass (its whole block; 0: ``1 + k``, a drafter whose pass follows k). One
    sequence: every length tried. Several: coordinate ascent (each sequence's best
    length given the others', until none changes) from two starts, every adaptive
    sequence at 0 and each at its best alone; the better result."""
    if len(choices) == 1:
        return [best_alone(cost, choices[0], pass_rows)]

    def rate(ks: list[int]) -> float:
        rows = sum(c.rows_at(k) for c, k in zip(choices, ks, strict=True))
        drows = sum(drafter_rows(k, pass_rows) for k in ks)
        gain = sum(c.gains[k] if k < len(c.gains) else c.gains[-1] for c, k in zip(choices, ks, strict=True))
        return gain / max(cost.step_ms(rows, drows), 1e-9)

    def ascend(ks: list[int]) -> tuple[float, list[int]]:
        best = rate(ks)
        for _ in range(4):
            changed = False
            for i, c in enumerate(choices):
                if c.pinned is not None:
                    continue
                keep = ks[i]
                for k in c.options():
                    ks[i] = k
                    r = rate(ks)
                    if r > best * (1 + 1e-9):
                        best, keep, changed = r, k, True
                ks[i] = keep
            if not changed:
                break
        return best, ks

    zero = [c.pinned if c.pinned is not None else 0 for c in choices]
    r0, k0 = ascend(list(zero))
    alone = [c.pinned if c.pinned is not None else best_alone(cost, c, pass_rows) for c in choices]
    r1, k1 = ascend(alone)
    return k1 if r1 > r0 else k0


def drafter_rows(k: int, pass_rows: int) -> int:
    """Drafter rows of a sequence drafting ``k`` (0: none): its block (``pass_rows``),
    or ``1 + k`` for a drafter whose pass follows k (``pass_rows`` 0)."""
    return (pass_rows or 1 + k) if k > 0 else 0


def best_alone(cost: CostModel, c: Choice, pass_rows: int) -> int:
    """One sequence's best length (the engine's every step: kept cheap)."""
    if c.pinned is not None:
        return c.pinned
    gains = c.gains
    best_k, best = 0, gains[0] / max(cost.step_ms(1, 0), 1e-9)
    for k in range(max(c.lo, 1), c.hi + 1):
        r = gains[min(k, len(gains) - 1)] / max(cost.step_ms(c.rows_at(k), drafter_rows(k, pass_rows)), 1e-9)
        if r > best * (1 + 1e-9):
            best_k, best = k, r
    return best_k
