"""The result of a training run: where the drafter went, what it measured and
how the measurement moved with training time (the tau curve)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .config import TrainConfig
from .data import Dataset
from .loop import Checkpoint, Point
from .shape import DrafterShape
from .target import TargetInfo

__all__ = ["TrainReport"]


@dataclasses.dataclass(frozen=True)
class TrainReport:
    """What ``train_drafter`` did. ``best_tau`` is the written drafter's online tau (tokens per
    target pass at ``draft_max`` on held-out prompts); ``curve`` holds every measurement."""

    output: Path
    target: Path
    steps: int
    train_minutes: float
    run_minutes: float  # this call's wall time (data, training and measurements)
    best_tau: float
    lossless: bool  # every measured output equalled the target's own greedy reply
    curve: tuple[Point, ...]
    n_sequences: int
    n_tokens: int
    shape: DrafterShape
    draft_max: int

    @staticmethod
    def of(
        cfg: TrainConfig, info: TargetInfo, s: DrafterShape, ds: Dataset, ck: Checkpoint, secs: float
    ) -> TrainReport:
        return TrainReport(
            output=cfg.output,
            target=info.path,
            steps=ck.step,
            train_minutes=ck.seconds / 60,
            run_minutes=secs / 60,
            best_tau=ck.best_tau,
            lossless=all(p.lossless for p in ck.points),
            curve=tuple(ck.points),
            n_sequences=len(ds),
            n_tokens=ds.n_tokens,
            shape=s,
            draft_max=cfg.draft_max,
        )

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["output"], d["target"] = str(self.output), str(self.target)
        d["shape"]["target_layers"] = list(self.shape.target_layers)
        return d
