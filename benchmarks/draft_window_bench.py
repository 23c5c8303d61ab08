"""Acceptance and drafter memory against context length, with and without a
drafter window (``Llama(..., draft_window=N)``).

For each context length (prompt tokens, held-out text cut to exactly that
length) and each window (0: the whole context), the pair generates greedily
from the same prompts; the script prints tau (tokens per target pass),
acceptance, decode speed, the median drafter block pass (ms), the drafter's KV
cache and compute buffers from ``llm.memory()``,
and whether every output equals the target's own greedy output.

    python benchmarks/draft_window_bench.py                       # the embedded pair
    python benchmarks/draft_window_bench.py --target T.gguf --draft D.gguf \\
        --contexts 512,1024,2048,4096,8192 --windows 0,256,512,1024,2048 --json out.json

The draft length is fixed at the block size - 1 (``draft_adaptive=False``), so
tau compares the drafter's quality, not the per-step length policy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pydflash import Llama, embedded_pair
from pydflash.bench.workload import WORKLOADS, make_prompts

MIB = 2**20


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def drafter_memory(llm: Llama) -> tuple[int, int]:
    rows = [r for r in llm.memory().rows if r.role == "drafter"]
    return sum(r.context for r in rows), sum(r.compute for r in rows)


def run_context(a: argparse.Namespace, isl: int, corpus: str) -> list[dict[str, object]]:
    n_ctx = isl + a.max_tokens + 64
    gen = dict(max_tokens=a.max_tokens, temperature=0.0, ignore_eos=True)
    with Llama(a.target, n_ctx=n_ctx, n_threads=a.threads) as base:
        prompts = make_prompts(base.tokenize, base.detokenize, isl, a.prompts, corpus)
        want = [base.generate(p, **gen).tokens for p in prompts]
    rows = []
    for window in a.windows:
        t0 = time.perf_counter()
        with Llama(
            a.target, draft=a.draft, n_ctx=n_ctx, n_threads=a.threads, draft_window=window, draft_adaptive=False
        ) as llm:
            kv, compute = drafter_memory(llm)
            results = [llm.generate(p, **gen) for p in prompts]
            seen = llm.pair.draft_window
        n_steps = sum(r.stats.n_steps for r in results)
        rows.append(
            {
                "isl": isl,
                "window": window,
                "draft_window": seen,
                "n_ctx": n_ctx,
                "tau": sum(len(r.tokens) for r in results) / max(n_steps, 1),
                "acceptance": sum(r.stats.n_accepted for r in results)
                / max(sum(r.stats.n_drafted for r in results), 1),
                "decode_tok_s": statistics.median(r.stats.decode_tokens_per_second for r in results),
                # the drafter's block pass: its attention spans the window (or the whole context)
                "draft_ms": statistics.median(s.t_draft_ms for r in results for s in r.stats.steps),
                "drafter_kv_mib": kv / MIB,
                "drafter_compute_mib": compute / MIB,
                "identical": all(r.tokens == w for r, w in zip(results, want, strict=True)),
                "seconds": time.perf_counter() - t0,
            }
        )
        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (
    f"{'ISL':>6} {'window':>7} {'tau':>6} {'accept':>7} {'tok/s':>7} {'draft ms':>8} {'dKV MiB':>8} {'dcomp MiB':>9} "
    "identical"
)


def format_row(r: dict[str, object]) -> str:
    w = r["window"] if r["draft_window"] else "whole"
    return (
        f"{r['isl']:>6} {w!s:>7} {r['tau']:6.2f} {r['acceptance']:7.3f} {r['decode_tok_s']:7.0f} {r['draft_ms']:8.2f} "
        f"{r['drafter_kv_mib']:8.2f} {r['drafter_compute_mib']:9.2f} {'yes' if r['identical'] else 'NO'}"
    )


def main(argv: list[str] | None = None) -> int:
    target, draft = embedded_pair()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=target, help="target GGUF (default: the embedded pair's)")
    p.add_argument("--draft", default=draft, help="drafter GGUF (default: the embedded pair's)")
    p.add_argument("--contexts", type=csv_ints, default=csv_ints("256,512,1024,2048"), help="prompt lengths")
    p.add_argument("--windows", type=csv_ints, default=csv_ints("0,64,128,256,512"), help="0: the whole context")
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts per context length")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--corpus", choices=sorted(WORKLOADS), default="code")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args(argv)
    corpus = WORKLOADS[a.corpus]()
    print(f"target {a.target}\ndrafter {a.draft}\n{a.prompts} prompts x {a.max_tokens} tokens, {a.corpus}")
    print(HEADER)
    rows = [row for isl in a.contexts for row in run_context(a, isl, corpus)]
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"target": a.target, "draft": a.draft, "corpus": a.corpus, "rows": rows}, f, indent=1)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
