"""The adaptive draft length's cost model: milliseconds of a step by the rows of
its target and drafter passes, calibrated once on the pair and corrected online
(``_draft_policy`` chooses lengths with it), and the other measurements it
divides or weighs timings with: the machine's speed, realized rates."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pydflash._core import Calibration

__all__ = ["COST_ALPHA", "CostModel", "MachineSpeed", "Rate"]

COST_ALPHA = 0.1  # weight of each step's timings in the online cost correction
SPEED_ALPHA = 0.3  # weight of each step in the machine's speed (a slow interval shows within steps)
SPEED_SLOW = 0.005  # ... in a kind of step's usual time (a slow interval of 40 steps moves it 18%)
SPEED_GATE = 20  # steps of a kind (target rows, drafter pass or not) seen before it moves the speed
SPEED_CLIP = 4.0  # one step moves it as if at most this much slower or faster (a pause is not a speed)


def _table(rows: Sequence[int], ms: Sequence[float], n: int) -> list[float]:
    """ms for 0..n rows: linear between the timed sizes, beyond them along the last
    slope, made non-decreasing (a pass of more rows never costs less; timing noise can say so)."""
    if not rows or len(rows) != len(ms):
        raise ValueError("a cost table needs as many times as sizes, at least one")
    out = [0.0]
    for r in range(1, n + 1):
        i = bisect.bisect_left(rows, r)
        if i < len(rows) and rows[i] == r:
            v = ms[i]
        elif i == 0:
            v = ms[0]
        elif i == len(rows):
            r0, r1 = (rows[-2], rows[-1]) if len(rows) > 1 else (rows[-1] - 1, rows[-1])
            m0, m1 = (ms[-2], ms[-1]) if len(rows) > 1 else (ms[-1], ms[-1])
            v = m1 + (m1 - m0) / max(r1 - r0, 1) * (r - r1)
        else:
            f = (r - rows[i - 1]) / (rows[i] - rows[i - 1])
            v = ms[i - 1] + f * (ms[i] - ms[i - 1])
        out.append(max(v, out[-1]))
    return out


class CostModel:
    """Milliseconds of one step: ``verify_ms(rows) + draft_ms(drafter rows)`` plus
    the overhead of a step with a drafter pass (``overhead_ms``) or without one
    (``plain_overhead_ms``). Built from timed pass sizes (``from_calibration``);
    ``observe`` scales it by what steps actually took: each overhead is a running
    average from 0 (optimistic, so both kinds of step are tried), each pass size's
    measured / calibrated ratio a running average from 1 (the calibration times
    each size as a run of that size; one slow pass, such as the first after a
    change of size, moves it a tenth of the way)."""

    def __init__(
        self,
        verify_rows: Sequence[int],
        verify_ms: Sequence[float],
        draft_rows: Sequence[int],
        draft_ms: Sequence[float],
        max_rows: int,
        overhead_ms: float = 0.0,
    ):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._v = _table(verify_rows, verify_ms, max_rows)
        self._d = _table(draft_rows, draft_ms, max_rows) if draft_rows else [0.0] * (max_rows + 1)
        self.draft_scale = 1.0
        self.overhead_ms = overhead_ms
        self.plain_overhead_ms = 0.0
        self.plain_seen = 0  # steps without a drafter pass observed (until the overhead is known)
        # per row count once seen, measured / calibrated (a run of one size reuses
        # llama.cpp's graph, a change of size rebuilds it: no one scale fits every size);
        # an unseen size takes its seen neighbours' ratios, interpolated
        self._ratio: dict[int, float] = {}
        self._sizes: list[int] = []  # the keys of _ratio, sorted

    @classmethod
    def from_calibration(cls, cal: Calibration, max_rows: int) -> CostModel:
        return cls(cal.verify_rows, cal.verify_ms, cal.draft_rows, cal.draft_ms, max_rows)

    @classmethod
    def uncalibrated(cls, max_rows: int) -> CostModel:
        """When no calibration could run: a memory-bound guess (a pass costs about
        the same for any few rows), corrected online like a calibrated one."""
        return cls([1, max_rows], [1.0, 1.0 + 0.02 * (max_rows - 1)], [1, max_rows], [0.2, 0.3], max_rows)

    def _at(self, table: list[float], rows: int) -> float:
        if rows <= self.max_rows:
            return table[rows]
        slope = table[self.max_rows] - table[self.max_rows - 1] if self.max_rows > 1 else 0.0
        return table[self.max_rows] + slope * (rows - self.max_rows)

    def verify_ms(self, rows: int) -> float:
        return self._at(self._v, rows) * self._verify_ratio(rows)

    def _verify_ratio(self, rows: int) -> float:
        r = self._ratio.get(rows)
        if r is not None:
            return r
        sizes = self._sizes
        if not sizes:  # nothing measured yet: the calibration as it is
            return 1.0
        i = bisect.bisect_left(sizes, rows)
        if i == 0:
            return self._ratio[sizes[0]]
        if i == len(sizes):
            return self._ratio[sizes[-1]]
        lo, hi = sizes[i - 1], sizes[i]
        f = (rows - lo) / (hi - lo)
        return self._ratio[lo] + f * (self._ratio[hi] - self._ratio[lo])

    def draft_ms(self, rows: int) -> float:
        """The drafter pass over ``rows`` block rows (0: no pass)."""
        return self._at(self._d, rows) * self.draft_scale if rows > 0 else 0.0

    def step_ms(self, rows: float, draft_rows: int) -> float:
        """A step's time; ``rows`` may be an expected count (a draft that a confidence
        cut may shorten): the target pass linear between the whole counts about it."""
        lo = int(rows)
        verify = self.verify_ms(lo)
        if rows > lo:
            verify += (rows - lo) * (self.verify_ms(lo + 1) - verify)
        if draft_rows > 0:
            return verify + self.draft_ms(draft_rows) + self.overhead_ms
        return verify + self.plain_overhead_ms

    def observe(
        self, rows: int, verify_ms: float, draft_rows: int, draft_ms: float, other_ms: float, times: int = 1
    ) -> None:
        """One step's measured times: the target pass over ``rows``, the drafter pass
        over ``draft_rows`` (0: none) and the rest of the step (``other_ms``);
        ``times``: as if seen that many times in a row."""
        a = COST_ALPHA if times == 1 else 1.0 - (1.0 - COST_ALPHA) ** times
        base = self._at(self._v, rows)
        if base > 0 and verify_ms > 0:
            ratio = verify_ms / base
            seen = self._ratio.get(rows)
            if seen is None:
                bisect.insort(self._sizes, rows)
                seen = 1.0
            self._ratio[rows] = seen + a * (ratio - seen)
        base = self._at(self._d, draft_rows)
        if draft_rows > 0 and base > 0 and draft_ms > 0:
            self.draft_scale += a * (draft_ms / base - self.draft_scale)
        if draft_rows > 0:
            self.overhead_ms += a * (max(other_ms, 0.0) - self.overhead_ms)
        else:
            self.plain_overhead_ms += a * (max(other_ms, 0.0) - self.plain_overhead_ms)
            self.plain_seen += times


class MachineSpeed:
    """How much slower the machine runs now than it usually does: a fast running
    average, over every kind of step (its target rows, with a drafter pass or not),
    of each step's wall time over that kind's usual time (a slow running average of
    its own). The policy divides every timing by it before it learns from them. On a
    shared machine steps slow down and speed up together for tens of steps at a time
    (here: 7.6% of plain steps over 1.6x the median, autocorrelated to 100 steps);
    without it the cost model and the realized rates learn such a stretch as the cost
    of the kind of step that ran in it. What persists (a calibration that misjudged a
    kind, a context that grew) becomes the kind's usual time, and so the model's to
    learn. Only kinds seen SPEED_GATE times move it (their usual time is the mean of
    those steps at first)."""

    def __init__(self) -> None:
        self.value = 1.0
        self._usual: dict[tuple[int, bool], tuple[float, float]] = {}  # kind: (usual ms, steps seen)

    def observe(self, rows: int, drafting: bool, wall_ms: float, times: int = 1) -> None:
        """A step of ``rows`` target rows (with a drafter pass or not), ``times`` in a
        row at this mean wall time."""
        if wall_ms <= 0:
            return
        key = (rows, drafting)
        usual, seen = self._usual.get(key, (wall_ms, 0.0))
        if seen >= SPEED_GATE:
            ratio = min(max(wall_ms / usual, 1.0 / SPEED_CLIP), SPEED_CLIP)
            self.value += (1.0 - (1.0 - SPEED_ALPHA) ** times) * (ratio - self.value)
        # a kind's usual time: the mean of its first SPEED_GATE steps, then a slow average
        a = times / (seen + times) if seen < SPEED_GATE else 1.0 - (1.0 - SPEED_SLOW) ** times
        self._usual[key] = (usual + a * (wall_ms - usual), seen + times)


class Rate:
    """Tokens per ms, exponentially weighted over observed steps."""

    __slots__ = ("decay", "ms", "n", "tokens")

    def __init__(self, decay: float):
        self.decay = decay
        self.tokens = self.ms = self.n = 0.0

    def observe(self, tokens: int, ms: float, times: int = 1) -> None:
        """A step's tokens and time (``times``: as if seen that many times in a row)."""
        d = self.decay**times
        w = (1.0 - d) / (1.0 - self.decay) if times > 1 else 1.0
        self.tokens = self.tokens * d + tokens * w
        self.ms = self.ms * d + ms * w
        self.n = self.n * d + w

    def charge(self, ms: float) -> None:
        """Time the last observed step caused later (no step of its own)."""
        self.ms += ms

    def value(self) -> float:
        return self.tokens / self.ms if self.ms > 0 else 0.0
