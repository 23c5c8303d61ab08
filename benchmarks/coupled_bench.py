#!/usr/bin/env python3
"""verify="coupled" against "rejection" and "match" (issue #52): acceptance, tau,
decode speed against the target alone, and whether the text is the target
alone's for the same seed, on the shipped pair and its memory-bound padded copy.

    python benchmarks/coupled_bench.py [--temps 0.3 0.7 1.0] [--prompts 6] [--osl 64] \
        [--pairs embedded padded] [--json benchmarks/results/coupled-....json]

Sampling: llama.cpp's default chain (top-k 40, top-p 0.95, min-p 0.05) at each
temperature, one seed per prompt. Every engine runs each prompt in turn (the order
rotating by prompt), so speeds are paired: a row's speed-up is the median over
prompts of its tok/s over the target alone's (standard sampling) on that prompt.
Drafting engines pin the length to the drafter's block (what a seeded rejection
or match request gets); "coupled-adaptive" lets the engine choose (what a seeded
coupled request gets). "same text": the fraction of prompts whose tokens equal the
target alone's with the same seed and verify mode. The prompt cache is on (each
prompt is evaluated once per model; decode speeds exclude the prompt).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHAIN = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}
MODES = ("coupled", "rejection", "match")


def engines(max_draft: int) -> dict[str, dict[str, Any]]:
    """Name -> (uses the drafter, generate() options)."""
    out: dict[str, dict[str, Any]] = {f"target-{m}": {"draft": False, "verify": m} for m in MODES}
    for m in MODES:
        out[m] = {"draft": True, "verify": m, "draft_max": max_draft}
    out["coupled-adaptive"] = {"draft": True, "verify": "coupled", "draft_max": None}
    return out


def run_pair(
    name: str, target: str, drafter: str, temps: list[float], prompts: list[str], osl: int, threads: int
) -> list[dict]:
    from pydflash import Llama

    rows = []
    kw = {"n_ctx": 1024, "n_threads": threads}
    with Llama(target, **kw) as base, Llama(target, draft=drafter, **kw) as llm:
        table = engines(llm.pair.max_draft)
        for temp in temps:
            per: dict[str, list[Any]] = {e: [] for e in table}
            names = list(table)
            for i, p in enumerate(prompts):
                order = names[i % len(names) :] + names[: i % len(names)]
                for e in order:
                    opts = dict(table[e])
                    who = llm if opts.pop("draft") else base
                    r = who.generate(
                        p, max_tokens=osl, temperature=temp, seed=1000 + i, ignore_eos=True, **CHAIN, **opts
                    )
                    per[e].append(r)
            base_rate = [r.stats.decode_tokens_per_second for r in per["target-rejection"]]
            for e, rs in per.items():
                rows.append(summary(name, temp, e, rs, per[f"target-{table[e]['verify']}"], base_rate))
                rows[-1]["mean_draft_length"] = (
                    statistics.fmean(s.draft_max for r in rs for s in r.stats.steps) if table[e]["draft"] else 0.0
                )
                print(fmt(rows[-1]), flush=True)
    return rows


def summary(pair: str, temp: float, engine: str, rs: list[Any], ref: list[Any], base_rate: list[float]) -> dict:
    """One engine's row: acceptance, tau, median and paired speed, text equal to ``ref``'s."""
    drafted = sum(r.stats.n_drafted for r in rs)
    rates = [r.stats.decode_tokens_per_second for r in rs]
    return {
        "pair": pair,
        "temperature": temp,
        "engine": engine,
        "acceptance": sum(r.stats.n_accepted for r in rs) / drafted if drafted else None,
        "tau": sum(len(r.tokens) for r in rs) / sum(r.stats.n_steps for r in rs),
        "tok_s_median": statistics.median(rates),
        "speedup_paired_median": statistics.median(r / b for r, b in zip(rates, base_rate, strict=True)),
        "same_text_as_target_alone": sum(r.tokens == t.tokens for r, t in zip(rs, ref, strict=True)) / len(rs),
    }


def fmt(r: dict) -> str:
    acc = "   -  " if r["acceptance"] is None else f"{r['acceptance']:6.3f}"
    return (
        f"{r['pair']:9s} T={r['temperature']:.1f} {r['engine']:17s} acc {acc}  tau {r['tau']:5.2f}  "
        f"{r['tok_s_median']:8.1f} tok/s  x{r['speedup_paired_median']:5.3f}  "
        f"same text {r['same_text_as_target_alone']:.2f}  len {r['mean_draft_length']:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temps", type=float, nargs="+", default=[0.3, 0.7, 1.0])
    ap.add_argument("--pairs", nargs="+", default=["embedded", "padded"], choices=["embedded", "padded"])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--pad-ffn", type=int, default=16384, help="the padded copy's FFN width (pydflash bench's)")
    ap.add_argument("--threads", type=int, default=1, help="n_threads (1: a shared machine's spinning workers cost)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    import pydflash
    from pydflash import Llama
    from pydflash.bench.workload import heldout_stdlib_text, make_prompts
    from pydflash.gguf_writers.padding import pad_ffn

    t, d = pydflash.embedded_pair()
    with Llama(t, n_ctx=256) as llm:
        prompts = make_prompts(llm.tokenize, llm.detokenize, a.isl, a.prompts, heldout_stdlib_text())
    rows: list[dict] = []
    t0 = time.time()
    with tempfile.TemporaryDirectory() as td:
        for name in a.pairs:
            target = str(t) if name == "embedded" else str(pad_ffn(t, Path(td) / "padded.gguf", a.pad_ffn))
            rows += run_pair(name, target, str(d), a.temps, prompts, a.osl, a.threads)
    if a.json:
        meta = {
            "command": "python benchmarks/coupled_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "note": "CPU, 2 cores shared with other jobs: speeds are noisy; acceptance, tau and same-text are not",
            "sampling": CHAIN,
            **{k: getattr(a, k) for k in ("isl", "osl", "prompts", "threads")},
            "seconds": round(time.time() - t0),
        }
        a.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
