"""The draft policy's costs pinned for a test: whatever a calibration measures on this busy
machine, the policy sees ``make(max_rows)`` and no online correction of it, so the lengths it
chooses follow the acceptance alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pydflash.draft_length import CostModel


def pin_costs(monkeypatch: pytest.MonkeyPatch, make: Callable[[int], CostModel]) -> None:
    monkeypatch.setattr(CostModel, "from_calibration", classmethod(lambda cls, cal, rows: make(rows)))
    monkeypatch.setattr(CostModel, "observe", lambda self, *args: None)


def compute_bound(max_rows: int) -> CostModel:
    """A target pass costs its rows (a compute-bound target, as these tiny ones on a CPU)."""
    return CostModel([1, max_rows], [1.0, float(max_rows)], [1, max_rows], [0.2, 0.3], max_rows)
