"""The optimization loop: AdamW with warmup and cosine decay, gradient clipping,
online tau every so often (the best drafter by it is the one written), a
checkpoint that lets ``--resume`` continue exactly (model, optimizer, step,
schedule; batches are a function of the step), and a deadline it ends on."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .data import Dataset
from .evaluate import Measured
from .model import Drafter
from .objective import block_loss, cosine_lr, draw_batch, slot_weights

__all__ = ["Checkpoint", "Loop", "Point"]


@dataclasses.dataclass(frozen=True)
class Point:
    """One online measurement during the run."""

    step: int
    minutes: float  # training minutes (the run's, resumes added up) when it was taken
    tau: float
    acceptance: float
    lossless: bool
    loss: float


@dataclasses.dataclass
class Checkpoint:
    """What ``--resume`` needs: the state after ``step`` steps and the run's record so far."""

    step: int = 0
    total: int = 0
    seconds: float = 0.0
    eval_seconds: float = 0.0  # what one online measurement took
    eval_every: int = 0  # steps between measurements
    best_tau: float = 0.0
    points: list[Point] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)
    model: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # what must match on resume
    reference: list[list[int]] = dataclasses.field(default_factory=list)  # the target alone's held-out outputs

    def save(self, path: Path) -> None:
        d = dataclasses.asdict(self)
        d["points"] = [dataclasses.asdict(p) for p in self.points]
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        os.close(fd)
        try:
            torch.save(d, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @staticmethod
    def load(path: Path) -> Checkpoint:
        d = torch.load(path, weights_only=False)
        d["points"] = [Point(**p) for p in d["points"]]
        return Checkpoint(**d)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Steps, evaluation and checkpoint spacing, batch shape and learning rate."""

    total: int
    eval_every: int
    checkpoint_every: int
    n_seqs: int
    n_anchors: int
    lr: float
    seed: int
    device: str = "cpu"


class Loop:
    """Trains ``model`` on ``ds`` from checkpoint ``ck``; ``measure`` exports and measures the
    drafter as it stands, ``keep`` makes the last measured drafter the output."""

    def __init__(
        self,
        model: Drafter,
        ds: Dataset,
        sched: Schedule,
        ck: Checkpoint,
        ck_path: Path,
        *,
        measure: Callable[[], Measured],
        keep: Callable[[], None],
        on_step: Callable[[int, float, float], None] | None = None,
    ):
        self.model, self.ds, self.sched, self.ck, self.ck_path = model, ds, sched, ck, ck_path
        self.measure, self.keep, self.on_step = measure, keep, on_step
        self.items = ds.items()
        self.weights = slot_weights(model.s.block_size)
        self.opt = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=sched.lr, betas=(0.9, 0.95), weight_decay=0.0
        )
        if ck.optimizer is not None:
            self.opt.load_state_dict(ck.optimizer)

    def step(self) -> float:
        """One optimizer step (the checkpoint's step + 1); returns its loss."""
        s, ck = self.sched, self.ck
        for g in self.opt.param_groups:
            g["lr"] = cosine_lr(ck.step, s.total, s.lr, max(1, s.total // 25))
        b = draw_batch(
            self.ds,
            self.items,
            s.seed,
            ck.step,
            n_seqs=s.n_seqs,
            n_anchors=s.n_anchors,
            block=self.model.s.block_size,
            device=s.device,
        )
        loss, _ = block_loss(self.model, b, self.weights, self.model.s.mask_token)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        ck.step += 1
        ck.losses.append(float(loss.item()))
        self.tokens = b.n_tokens
        return ck.losses[-1]

    def evaluate(self) -> Point:
        m = self.measure()
        ck = self.ck
        recent = ck.losses[-max(1, self.sched.eval_every) :]
        p = Point(ck.step, ck.seconds / 60, m.tau, m.acceptance, m.lossless, float(np.mean(recent)) if recent else 0.0)
        ck.points.append(p)
        if m.tau > ck.best_tau:  # tau >= 1 always: the first measurement is kept
            ck.best_tau = m.tau
            self.keep()
        return p

    def save(self) -> None:
        self.ck.model = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.ck.optimizer = self.opt.state_dict()
        self.ck.save(self.ck_path)

    def run(self, deadline: float | None, eval_reserve: float) -> None:
        """Steps until the schedule's end or the deadline (keeping ``eval_reserve`` seconds for the
        last measurement), measuring every ``eval_every`` steps and once at the end."""
        s, ck = self.sched, self.ck
        last = time.monotonic()
        evaluated_at = ck.points[-1].step if ck.points else -1
        while ck.step < s.total:
            if deadline is not None and time.monotonic() + eval_reserve >= deadline:
                break
            loss = self.step()
            now = time.monotonic()
            ck.seconds += now - last
            if self.on_step is not None:
                self.on_step(ck.step, loss, self.tokens / max(1e-9, now - last))
            last = now
            if ck.step % s.eval_every == 0:
                self.evaluate()
                evaluated_at = ck.step
                last = time.monotonic()  # measurement time is not training time
            if ck.step % s.checkpoint_every == 0 or ck.step == s.total:
                self.save()
                last = time.monotonic()
        if evaluated_at != ck.step:
            self.evaluate()
        self.save()
