#!/usr/bin/env python3
"""The adaptive draft length, new policy against the frozen old one
(benchmarks/legacy_policy/), paired in one process on one pair: per prompt every
engine runs once, in a rotated order, each run after a short untimed one (as
`pydflash bench` does); "old-b" is a second old engine, so old / old-b is the
ratios' own noise band. It prints median decode tok/s per engine and the medians
of per-prompt ratios, and writes them (with its command) to --json.

    PYTHONPATH=src:. python benchmarks/policy_ab.py --pair embedded --workload code \
        --prompts 30 --json benchmarks/results/policy-ab-embedded-code.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.legacy_policy.engine import LegacyEngine

from pydflash import Llama, embedded_pair
from pydflash.bench.tasks import prompts as workload_prompts
from pydflash.bench.workload import text_codec
from pydflash.engine.engine import Engine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", choices=["embedded", "padded"], default="embedded")
    ap.add_argument("--workload", choices=["code", "prose", "edit"], default="code")
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="1: a busy machine stalls 2 threads' barriers")
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    target, draft = embedded_pair()
    with tempfile.TemporaryDirectory() as td:
        if a.pair == "padded":
            from pydflash.gguf_writers.padding import pad_ffn

            target = str(pad_ffn(target, Path(td) / "target-padded.gguf", 16384))
        kw = dict(n_ctx=512, n_batch=512, n_threads=a.threads)
        alone = Llama(target, **kw)  # type: ignore[arg-type]
        pair = Llama(target, draft=draft, **kw)  # type: ignore[arg-type]
        core, cpair, chunk = pair._engine._core, pair._engine._pair, pair._engine._chunk
        engines: dict[str, Engine] = {
            "new": pair._engine,
            "old": LegacyEngine(core, cpair, chunk),
            "old-b": LegacyEngine(core, cpair, chunk),
        }
        texts = workload_prompts(a.workload, *text_codec(pair), a.isl, a.prompts)
        names = ["target", *engines]
        speed: dict[str, list[float]] = {n: [] for n in names}
        drafted: dict[str, list[int]] = {n: [] for n in names}

        def run(name: str, ids: list[int], n: int) -> tuple[float, int]:
            llm = alone if name == "target" else pair
            if name != "target":
                pair._engine = engines[name]
            r = llm.generate(ids, max_tokens=n, ignore_eos=True, cache_prompt=False)
            return r.stats.decode_tokens_per_second, r.stats.n_drafted

        warm = pair.tokenize(texts[0])
        for n in names:
            run(n, warm, 16)
        t0 = time.time()
        for i, text in enumerate(texts):
            ids = pair.tokenize(text)
            order = names[i % len(names) :] + names[: i % len(names)]
            for n in order:
                run(n, warm, 4)
                s, d = run(n, ids, a.osl)
                speed[n].append(s)
                drafted[n].append(d)
            print(f"[{i + 1}/{len(texts)}] " + "  ".join(f"{n} {speed[n][-1]:.1f}" for n in names), flush=True)

        def ratio(x: str, y: str) -> float:
            return statistics.median(p / q for p, q in zip(speed[x], speed[y], strict=True))

        out = {
            "command_line": "PYTHONPATH=src:. python " + shlex.join(["benchmarks/policy_ab.py", *sys.argv[1:]]),
            "pair": a.pair,
            "workload": a.workload,
            "prompts": len(texts),
            "seconds": round(time.time() - t0, 1),
            "median_tok_s": {n: statistics.median(v) for n, v in speed.items()},
            "mean_drafted": {n: statistics.mean(v) for n, v in drafted.items()},
            "paired_median_ratio": {
                "new/old": ratio("new", "old"),
                "new/old-b": ratio("new", "old-b"),
                "old/old-b (noise)": ratio("old", "old-b"),
                "new/target": ratio("new", "target"),
                "old/target": ratio("old", "target"),
            },
            "tok_s": speed,
        }
        for n in names:
            print(f"{n:7} median {out['median_tok_s'][n]:8.1f} tok/s, drafted {out['mean_drafted'][n]:.1f}/run")
        for k, v in out["paired_median_ratio"].items():
            print(f"{k:18} {v:.3f}")
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
        for e in engines.values():
            e.close()
        pair._engine = engines["new"]
        pair.close()
        alone.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
