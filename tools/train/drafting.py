"""The drafter stage: `pydflash.train` (the product) on the target's own greedy
continuations of code windows. This file only chooses the windows: lengths
from 16 tokens to the target's context (as many short ones as long ones, so
that the drafter serves short prompts and long contexts alike), cut from the
training split; the held-out split's windows come last, for the online tau."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

BLOCK = 8
CONT_LEN = 96  # tokens of the target's reply per prompt


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def window_lengths(n: int, context_max: int, rng: np.random.Generator) -> np.ndarray:
    """Half of the prompts log-uniform in 16..128 tokens, half uniform in 128..context_max - CONT_LEN."""
    short = np.exp(rng.uniform(np.log(16), np.log(128), n // 2))
    long = rng.uniform(128, max(129, context_max - CONT_LEN - 8), n - n // 2)
    lengths = np.concatenate([short, long]).astype(np.int64)
    rng.shuffle(lengths)
    return lengths


def prompts_file(out: Path, n: int, n_heldout: int, context_max: int, seed: int) -> Path:
    """prompts.jsonl: ``{"prompt": text}`` windows of the training split, then ``n_heldout`` of the held-out one."""
    from pydflash import Llama

    path = out / "drafter-prompts.jsonl"
    if path.exists():
        return path
    rng = np.random.default_rng(seed + 1)
    lines = []
    with Llama(out / "target.gguf", n_ctx=256) as llm:
        for split, count in (("train", n), ("heldout", n_heldout)):
            data = np.load(out / f"{split}.npy")
            for length in window_lengths(count, context_max, rng):
                s = int(rng.integers(0, len(data) - length))
                text = llm.detokenize(data[s : s + length].tolist()).decode("utf-8", "replace")
                lines.append(json.dumps({"prompt": text}))
    path.write_text("\n".join(lines) + "\n")
    return path


def stage_drafter(out: Path, args) -> None:
    """Train (or continue) drafter.gguf with pydflash.train; the report goes to drafter-report.json."""
    if (out / "drafter.gguf").exists() and not args.drafter_resume:
        return
    from pydflash.train import train_drafter

    prompts = prompts_file(out, args.prompts, 16, args.context_max or 4096, args.seed)
    log(f"drafter: pydflash.train on {prompts}")
    report = train_drafter(
        out / "target.gguf", out / "drafter.gguf", prompts=prompts, init=args.drafter_init, layers=args.drafter_layers,
        block_size=BLOCK, steps=args.drafter_steps, time_budget=args.drafter_minutes if args.drafter_steps is None
        else None, resume=args.drafter_resume, max_prompts=args.prompts, max_prompt_tokens=4096 - CONT_LEN - 8,
        max_response=CONT_LEN, eval_prompts=16, eval_tokens=96, seed=args.seed, threads=args.threads,
        cache_dir=out / "train-cache", anchors=16, batch_tokens=16384,
        **({} if args.drafter_lr is None else {"lr": args.drafter_lr}),
    )  # fmt: skip
    (out / "drafter-report.json").write_text(json.dumps(report.to_json(), indent=1))
    log(f"drafter: online tau {report.best_tau:.2f} after {report.steps} steps ({report.train_minutes:.0f} min)")
