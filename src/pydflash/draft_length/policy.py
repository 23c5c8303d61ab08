"""The adaptive draft length: how many tokens each running sequence drafts this step.

A draft of k yields on average ``E(k) = 1 + sum_{j<=k} prod_{i<=j} c_i`` tokens, c_i the chance
that position i is kept where the ones before it were: per sequence, a running average of its
recent steps, each position shrunk toward the pair's own (the pooled prior); the chance that the
confidence cut lets a position in is estimated alike (a length costs the rows the cut leaves).
``choose`` (before a step) picks the lengths that maximise expected tokens per ms of the step the
sequences share (one target pass over all their rows, one drafter pass), priced by ``CostModel``;
``observe`` learns from it. While every sequence is at 0, one (the longest off) probes now and then
with a full draft, spaced so that probes lose at most ``PROBE_BUDGET`` of the time."""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Sequence
from typing import NamedTuple

from .cost import CostModel, MachineSpeed

__all__ = ["CONFIDENCE_CUT", "CostModel", "DraftPolicy", "Outcome", "SequenceDraft", "drafter_rows", "gains"]

PRIOR = 0.6  # c_1 before anything was seen on the pair
PRIOR_WEIGHT = 2.0  # pseudo-observations of a position's prior
DECAY = 0.9  # a sequence's estimate: weight of the past per step (about its last 10)
POOLED_DECAY = 0.98  # the pair's (slower: one unlucky sequence does not stop the next)
PROBE_BUDGET = 0.01  # probes lose at most this share of the time against plain steps ...
PROBE_ROOM = 0.5  # ... where a whole block kept would save this share of a probe's time; less pro rata
PROBE_MIN, PROBE_MAX = 4, 4096  # steps off between probes
PROBE_WEIGHT = 2.0  # a probe counts as this many steps (it is the only news while off)
PROBE_ALPHA = 0.25  # weight of each probe's measured time
RECHECK = 8  # sequences that are off but could drift on are weighed again this often
PROBE_NEWS = 16  # drafting steps seen before probes keep to the budget (until then a doubling wait)
CONFIDENCE_CUT = 0.5  # a DFlash draft ends below this probability (draft_p_min, where a generation sets none)


def gains(c: Sequence[float], k_max: int) -> list[float]:
    """E(0..k_max) for rates ``c``; of the cut's passing rates, the expected target rows."""
    return list(itertools.accumulate(itertools.accumulate(c[:k_max], operator.mul, initial=1.0)))


def drafter_rows(k: int, pass_rows: int) -> int:
    """A drafting sequence's drafter rows: its block (``pass_rows``), else ``1 + k``."""
    return (pass_rows or 1 + k) if k > 0 else 0


class _Estimate:
    """Per-position rates, exponentially weighted, each shrunk toward a prior: another
    estimate's rates, or a number (then the rate before it where that is higher)."""

    def __init__(self, n: int, decay: float, prior: float = PRIOR):
        self.n, self.decay, self.prior = n, decay, prior
        self._hit, self._try = [0.0] * n, [0.0] * n

    def observe(self, n_tried: int, n_ok: int, weight: float = 1.0) -> None:
        """Positions 1..n_ok passed, the next failed (if tried); all weigh less with age."""
        self.forget()
        for i in range(min(n_tried, n_ok + 1, self.n)):
            self._try[i] += weight
            self._hit[i] += weight if i < n_ok else 0.0

    def forget(self, steps: int = 1) -> None:
        d = self.decay**steps
        self._hit, self._try = [h * d for h in self._hit], [t * d for t in self._try]

    def rates(self, prior: Sequence[float] | None = None) -> list[float]:
        out: list[float] = []
        for i in range(self.n):
            p = prior[i] if prior is not None else max([self.prior, *out[-1:]])
            out.append((self._hit[i] + PRIOR_WEIGHT * p) / (self._try[i] + PRIOR_WEIGHT))
        return out


class Outcome(NamedTuple):
    """One sequence's part of a step: the draft length asked, the tokens drafted (the
    cut, a grammar or the budget may end a draft early) and those kept. ``counts``:
    the draft is the drafter's (an n-gram draft says nothing of its acceptance)."""

    asked: int
    drafted: int
    accepted: int
    counts: bool = True


@dataclasses.dataclass
class SequenceDraft:
    """One generation's state in the policy."""

    kept: _Estimate  # c_i: a drafted token kept
    passing: _Estimate  # a position let into the draft by the confidence cut
    quiet: int = 0  # steps (this one included) that stay plain without a weighing
    off: int = 0  # its steps since its last draft: the longest off probes first


Step = Sequence[SequenceDraft | None]  # the sequences of a step (None: a pinned length)


@dataclasses.dataclass
class _Option:
    tokens: list[float]  # expected tokens per length 0..hi
    rows: list[float]  # expected target rows per length
    lo: int  # the shortest draft allowed (draft_min); 0 always is
    hi: int  # the longest
    pinned: int | None = None

    def lengths(self) -> list[int]:
        return [self.pinned] if self.pinned is not None else [0, *range(max(self.lo, 1), self.hi + 1)]


class DraftPolicy:
    """``new_sequence`` per generation, ``choose`` before each step, ``observe`` after it."""

    def __init__(self, cost: CostModel, max_draft: int, pass_rows: int = 0, cut: float = 0.0):
        self.cost = cost
        self.max_draft = max_draft
        self.pass_rows = pass_rows  # drafter rows per drafting sequence (0: 1 + k)
        self.cut = cut  # the confidence cut where a generation sets no draft_p_min
        self.pooled = _Estimate(max_draft, POOLED_DECAY)
        self.pooled_pass = _Estimate(max_draft, POOLED_DECAY, prior=1.0)
        self.speed = MachineSpeed()
        self.probe_ms = 0.0  # a probe's measured wall time (it injects the rows deferred while off)
        self._off = 0  # steps with no draft since the last drafting step or probe: the probes' clock
        self._news = self._probes = 0  # drafting steps observed, probes chosen
        self._probing: SequenceDraft | None = None  # this step's probe

    def new_sequence(self) -> SequenceDraft:
        """A generation's state, its estimates the pair's. Where the pair's say off and no
        probe is due, it starts quiet (the engine leaves its prompt's features waiting)."""
        st = SequenceDraft(_Estimate(self.max_draft, DECAY), _Estimate(self.max_draft, DECAY, prior=1.0))
        o = self._option(self.pooled.rates(), self.pooled_pass.rates(), 0, self.max_draft)
        if self._joint([o]) == [0]:
            st.quiet = max(self._spacing(o) - self._off, 0)
        return st

    def choose(self, seqs: Step, caps: Sequence[int], floors: Sequence[int]) -> list[int]:
        """This step's length per sequence: ``seqs[i]`` None is pinned to ``caps[i]``;
        otherwise one of 0 and ``floors[i]..caps[i]``."""
        if seqs and all(st is not None and st.quiet > 0 for st in seqs):
            return [0] * len(seqs)
        pk, pp = self.pooled.rates(), self.pooled_pass.rates()
        opts: list[_Option] = []
        for st, cap, lo in zip(seqs, caps, floors, strict=True):
            cap = max(0, min(cap, self.max_draft))
            if st is None:
                opts.append(_Option(gains(pk, cap), [1.0 + k for k in range(cap + 1)], 0, cap, pinned=cap))
            else:
                opts.append(self._option(st.kept.rates(pk), st.passing.rates(pp), lo, cap))
        ks, self._probing = self._joint(opts), None
        # a probe where the step drafts nothing: one sequence's, which makes it a drafting step
        off = [(st, o, i) for i, (st, o) in enumerate(zip(seqs, opts, strict=True)) if st and o.hi >= max(o.lo, 1)]
        if any(ks) or not off:
            return ks
        st, o, i = max(off, key=lambda c: c[0].off)
        spacing = self._spacing(o, *self._sums(opts, ks)[:2])
        if self._off >= spacing:
            ks[i], self._probing, self._probes = o.hi, st, self._probes + 1
            return ks
        # where even the pair's estimates (each one's drift while off) say 0, nothing changes
        pooled = [self._option(pk, pp, o.lo, o.hi) if s else o for s, o in zip(seqs, opts, strict=True)]
        quiet = spacing - self._off if not any(self._joint(pooled)) else min(RECHECK, spacing - self._off)
        for s in filter(None, seqs):
            s.quiet = quiet
        return ks

    def observe(
        self, seqs: Step, outcomes: Sequence[Outcome], verify_ms: float, draft_ms: float, wall_ms: float, times: int = 1
    ) -> None:
        """A step's outcomes (one per sequence, as chosen) and timings: the target pass, the drafter
        pass (0: none), the whole step; ``times``: as many plain steps in a row, these their means."""
        rows = sum(1 + o.drafted for o in outcomes)
        drows = sum(drafter_rows(o.asked, self.pass_rows) for o in outcomes) if draft_ms > 0 else 0
        self.speed.observe(rows, drows > 0, wall_ms, times)
        s = self.speed.value
        self.cost.observe(rows, verify_ms / s, drows, draft_ms / s, (wall_ms - verify_ms - draft_ms) / s, times)
        self._off = 0 if any(st and o.asked > 0 for st, o in zip(seqs, outcomes, strict=True)) else self._off + times
        for st, o in zip(seqs, outcomes, strict=True):
            if st is None:
                continue
            st.quiet, st.off = max(st.quiet - times, 0), 0 if o.asked > 0 else st.off + times
            if o.asked <= 0:  # off: its estimates return toward the pair's
                st.kept.forget(times)
                st.passing.forget(times)
                continue
            if not o.counts:
                continue
            self._news += 1
            w = PROBE_WEIGHT if st is self._probing else 1.0
            st.passing.observe(o.asked, o.drafted, w)
            self.pooled_pass.observe(o.asked, o.drafted)
            if o.drafted > 0:
                st.kept.observe(o.drafted, o.accepted, w)
                self.pooled.observe(o.drafted, o.accepted)
            if st is self._probing and len(seqs) == 1:
                self.probe_ms += PROBE_ALPHA * (wall_ms / s - self.probe_ms) if self.probe_ms else wall_ms / s

    def _option(self, kept: list[float], passing: list[float], lo: int, cap: int) -> _Option:
        return _Option(gains([c * p for c, p in zip(kept, passing, strict=True)], cap), gains(passing, cap), lo, cap)

    def _sums(self, opts: Sequence[_Option], ks: Sequence[int]) -> tuple[float, float, int]:
        """A step's expected tokens, expected target rows and drafter rows."""
        pairs = list(zip(opts, ks, strict=True))
        tok, rows = sum(o.tokens[k] for o, k in pairs), sum(o.rows[k] for o, k in pairs)
        return tok, rows, sum(drafter_rows(k, self.pass_rows) for k in ks)

    def _rate(self, opts: Sequence[_Option], ks: Sequence[int]) -> float:
        return (s := self._sums(opts, ks))[0] / max(self.cost.step_ms(s[1], s[2]), 1e-9)

    def _joint(self, opts: Sequence[_Option]) -> list[int]:
        """The lengths that maximise expected tokens per ms of the shared step: one
        sequence, every length; several, a coordinate ascent from two starts (the best
        length common to all; each at its best alone), the better end; it keeps the
        step's sums, one sequence's share changed (its cost is paid on every step)."""
        if len(opts) == 1:
            return [max(opts[0].lengths(), key=lambda k: (self._rate(opts, [k]), -k))]
        common = [
            [o.pinned if o.pinned is not None else (min(k, o.hi) if min(k, o.hi) >= o.lo else 0) for o in opts]
            for k in range(self.max_draft + 1)
        ]
        pr, ends = self.pass_rows, []
        for start in (max(common, key=lambda ks: self._rate(opts, ks)), [self._joint([o])[0] for o in opts]):
            ks, best = list(start), self._rate(opts, start)
            tok, rows, drows = self._sums(opts, ks)
            for _ in range(4):
                changed = False
                for i, o in enumerate(opts):
                    k0 = ks[i]
                    t0, r0, d0 = tok - o.tokens[k0], rows - o.rows[k0], drows - drafter_rows(k0, pr)
                    for k in o.lengths():
                        t, r, d = t0 + o.tokens[k], r0 + o.rows[k], d0 + drafter_rows(k, pr)
                        if (rate := t / max(self.cost.step_ms(r, d), 1e-9)) > best * (1 + 1e-9):
                            ks[i], best, changed, tok, rows, drows = k, rate, True, t, r, d
                if not changed:
                    break
            ends.append((best, ks))
        return max(ends, key=lambda e: e[0])[1]

    def _spacing(self, o: _Option, tokens: float = 1.0, rows: float = 1.0) -> int:
        """Steps off per probe of ``o`` in a plain step of ``tokens`` and ``rows`` (its own
        among them) that keep the probe's expected loss against that step within the budget,
        which shrinks with the time a whole block kept would save (none: never)."""
        plain = max(self.cost.step_ms(rows, 0), 1e-9)
        lone = self.probe_ms - self.cost.step_ms(1, 0)  # a lone probe's measured time, its injection too
        probe = max(self.cost.step_ms(rows - 1 + o.rows[o.hi], drafter_rows(o.hi, self.pass_rows)), plain + lone)
        room = 1.0 - probe / (plain * (tokens + o.hi) / tokens)
        budget = PROBE_BUDGET * min(room / PROBE_ROOM, 1.0) * plain
        loss = probe - plain * (tokens - 1 + o.tokens[o.hi]) / tokens
        spacing = min(max(math.ceil(loss / budget), PROBE_MIN), PROBE_MAX) if budget > 0 else PROBE_MAX
        # a new pair's first drafts come at a generation's first positions, where drafters keep least
        early = self._news < PROBE_NEWS and room >= PROBE_ROOM
        return min(spacing, PROBE_MIN << self._probes) if early else spacing
