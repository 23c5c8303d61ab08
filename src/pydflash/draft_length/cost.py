"""What a step costs: milliseconds by the rows of its target and drafter passes, calibrated once on
the pair and corrected online, and the machine's speed that every timing is divided by first."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from .._core import Calibration

__all__ = ["CostModel", "MachineSpeed"]

COST_ALPHA = 0.1  # weight of each step's timings in the online correction (at least; a mean before)
SPEED_ALPHA = 0.3  # weight of each step in the machine's speed (a busy stretch shows within steps)
SPEED_SLOW = 0.005  # ... in a kind of step's usual time
SPEED_GATE = 20  # steps of a kind seen before it moves the speed
SPEED_CLIP = 4.0  # one step moves it as if at most this much slower or faster (a pause is not a speed)


def _table(rows: Sequence[int], ms: Sequence[float], n: int) -> list[float]:
    """ms for 0..n rows: linear between the timed sizes, the last slope beyond, never decreasing."""
    if not rows or len(rows) != len(ms):
        raise ValueError("a cost table needs as many times as sizes, at least one")
    out = [0.0]
    for r in range(1, n + 1):
        i = bisect.bisect_left(rows, r)
        if i == 0:
            v = ms[0]
        elif i == len(rows):
            r0, m0 = (rows[-2], ms[-2]) if len(rows) > 1 else (rows[-1] - 1, ms[-1])
            v = ms[-1] + (ms[-1] - m0) / max(rows[-1] - r0, 1) * (r - rows[-1])
        else:
            v = ms[i - 1] + (r - rows[i - 1]) / (rows[i] - rows[i - 1]) * (ms[i] - ms[i - 1])
        out.append(max(v, out[-1]))
    return out


class CostModel:
    """Milliseconds of one step: a target pass over its rows, a drafter pass (or none) and the
    rest, with and without a drafter pass. ``observe`` corrects the target pass by ratios kept at
    some sizes, linear between them (a busy batch's drafting steps seldom repeat a row count)."""

    def __init__(
        self,
        verify_rows: Sequence[int],
        verify_ms: Sequence[float],
        draft_rows: Sequence[int],
        draft_ms: Sequence[float],
        max_rows: int,
    ):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._v = _table(verify_rows, verify_ms, max_rows)
        self._d = _table(draft_rows, draft_ms, max_rows) if draft_rows else [0.0] * (max_rows + 1)
        self.draft_scale = 1.0
        self.overhead_ms = 0.0  # a step with a drafter pass, beside its passes
        self.plain_overhead_ms = 0.0  # one without
        # the target pass's correction: at every size to 16 rows and the timed ones, linear between
        self._grid = sorted({*range(1, min(max_rows, 16) + 1), *verify_rows})
        self._ratio = [1.0] * len(self._grid)  # a size's own ratio, else the nearest seen one's
        self._own: dict[int, tuple[float, float]] = {}  # where seen: (measured / calibrated, passes)
        self._near: list[int] = []  # by size: the nearest seen one

    @classmethod
    def from_calibration(cls, cal: Calibration, max_rows: int) -> CostModel:
        return cls(cal.verify_rows, cal.verify_ms, cal.draft_rows, cal.draft_ms, max_rows)

    @classmethod
    def uncalibrated(cls, max_rows: int) -> CostModel:
        """A memory-bound guess where no calibration could run, corrected online."""
        return cls([1, max_rows], [1.0, 1.0 + 0.02 * (max_rows - 1)], [1, max_rows], [0.2, 0.3], max_rows)

    def _at(self, table: list[float], rows: int) -> float:
        m = self.max_rows  # beyond it, the last slope
        return table[rows] if rows <= m else table[m] + (table[m] - table[m - 1] if m > 1 else 0.0) * (rows - m)

    def _between(self, rows: int) -> tuple[int, int, float, float]:
        """The correction's sizes about ``rows`` (indices), the upper one's weight, the ratio there."""
        i = min(max(bisect.bisect_right(self._grid, rows) - 1, 0), len(self._grid) - 1)
        g, r, j = self._grid, self._ratio, min(i + 1, len(self._grid) - 1)
        w = (min(max(rows, g[i]), g[j]) - g[i]) / max(g[j] - g[i], 1)
        return i, j, w, r[i] + w * (r[j] - r[i])

    def verify_ms(self, rows: int) -> float:
        return self._at(self._v, rows) * self._between(rows)[3]

    def draft_ms(self, rows: int) -> float:
        return self._at(self._d, rows) * self.draft_scale if rows > 0 else 0.0

    def step_ms(self, rows: float, draft_rows: int) -> float:
        """A step's time; ``rows`` may be an expected count (a confidence cut may shorten
        the draft): linear between the whole counts about it."""
        lo = int(rows)
        verify = self.verify_ms(lo)
        if rows > lo:
            verify += (rows - lo) * (self.verify_ms(lo + 1) - verify)
        return verify + (self.draft_ms(draft_rows) + self.overhead_ms if draft_rows > 0 else self.plain_overhead_ms)

    def observe(
        self, rows: int, verify_ms: float, draft_rows: int, draft_ms: float, other_ms: float, times: int = 1
    ) -> None:
        """One step's measured passes and other time, as if seen ``times`` times in a row."""
        a = 1.0 - (1.0 - COST_ALPHA) ** times
        base = self._at(self._v, rows)
        if base > 0 and verify_ms > 0:
            i, j, w, _ = self._between(rows)
            for k, share in ((i, (1 - w) * times), (j, w * times)) if w > 0 else ((i, times),):
                n = self._own.get(k, (1.0, 1.0))[1] + share  # its start counts one pass: a mean first
                rate = max(share / n, 1.0 - (1.0 - COST_ALPHA) ** share)
                self._own[k] = (self._ratio[k] + rate * (verify_ms / base - self._ratio[k]), n)
            if len(set(self._near)) != len(self._own):  # a size seen first (each seen one is its own nearest)
                self._near = [min(self._own, key=lambda s: abs(s - k)) for k in range(len(self._grid))]
            self._ratio = [self._own[s][0] for s in self._near]
        if draft_rows > 0:
            base = self._at(self._d, draft_rows)
            if base > 0 and draft_ms > 0:
                self.draft_scale += a * (draft_ms / base - self.draft_scale)
            self.overhead_ms += a * (max(other_ms, 0.0) - self.overhead_ms)
        else:
            self.plain_overhead_ms += a * (max(other_ms, 0.0) - self.plain_overhead_ms)


class MachineSpeed:
    """How much slower the machine runs now than usual: a fast average over every kind
    of step (target rows, drafter pass or not) of its time over the kind's usual time
    (a slow average). Divided by it, a busy stretch of a shared machine is not learnt
    as the cost of the steps that ran in it; what persists becomes their usual time."""

    def __init__(self) -> None:
        self.value = 1.0
        self._usual: dict[tuple[int, bool], tuple[float, float]] = {}  # kind: (usual ms, steps seen)

    def observe(self, rows: int, drafting: bool, wall_ms: float, times: int = 1) -> None:
        if wall_ms <= 0:
            return
        usual, seen = self._usual.get((rows, drafting), (wall_ms, 0.0))
        if seen >= SPEED_GATE:
            ratio = min(max(wall_ms / usual, 1.0 / SPEED_CLIP), SPEED_CLIP)
            self.value += (1.0 - (1.0 - SPEED_ALPHA) ** times) * (ratio - self.value)
        a = times / (seen + times) if seen < SPEED_GATE else 1.0 - (1.0 - SPEED_SLOW) ** times
        self._usual[rows, drafting] = (usual + a * (wall_ms - usual), seen + times)
