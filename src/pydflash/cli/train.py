"""``pydflash train-drafter``: its flags are ``TrainConfig``'s fields, declared there once."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from ..train.config import TrainConfig


def _type_of(f: dataclasses.Field[Any]) -> Any:
    """The argparse ``type`` of a field: the non-None part of its annotation."""
    hints = typing.get_type_hints(TrainConfig)
    t = hints[f.name]
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser(
        "train-drafter",
        help="train a DFlash drafter for a GGUF target (pip install 'pydflash[train]')",
        description="Train a DFlash drafter for TARGET and write it to OUTPUT (upstream llama.cpp's dflash layout). "
        "The target writes the data itself (its own prompts unless --prompts, its own greedy replies, its layer "
        "inputs captured through llama.cpp); training measures tau online on held-out prompts and writes the best "
        "drafter by it. Data, features and checkpoints are cached; --resume continues a run where it stopped.",
    )
    for f in dataclasses.fields(TrainConfig):
        meta = dict(f.metadata)
        flag = meta.pop("flag")
        names = [flag]
        if f.name in ("target", "output"):
            names.append("--model" if f.name == "target" else "--output")
        meta["dest"] = f.name
        if meta.get("action") in ("store_true", "store_false"):
            pass
        elif _type_of(f) is bool:
            meta["action"] = "store_true"
        else:
            meta["type"] = _type_of(f)
        if f.default is not dataclasses.MISSING and "action" not in meta:
            meta["default"] = f.default
        if f.default is not dataclasses.MISSING and f.default is not None and not isinstance(f.default, bool):
            meta["help"] += " (default: %(default)s)"
        t.add_argument(*names, **meta)
    t.add_argument("--report", type=Path, metavar="JSON", help="also write the run's report (the tau curve) here")


def run(a: argparse.Namespace) -> int:
    from ..train import train_drafter

    opts = {f.name: getattr(a, f.name) for f in dataclasses.fields(TrainConfig) if f.name not in ("target", "output")}
    if opts["cache_dir"] is None:
        del opts["cache_dir"]
    r = train_drafter(a.target, a.output, **opts)
    print(
        f"wrote {r.output}: tau {r.best_tau:.2f} at draft_max {r.draft_max} on held-out prompts "
        f"({r.steps} steps, {r.train_minutes:.1f} min of training, {r.run_minutes:.1f} min in all; "
        f"{r.n_sequences} sequences, {r.n_tokens} tokens){'' if r.lossless else '; WARNING: an output differed'}",
        file=sys.stderr,
    )
    if a.report is not None:
        a.report.write_text(json.dumps(r.to_json(), indent=1))
    return 0
