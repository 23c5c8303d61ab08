"""Decode speed of two Llama objects used in turn in one process, and of one
Llama after a direct pair call on the main thread, with the OpenMP pools
released (csrc/threads.h) and, for comparison in the same run, not released.

    python benchmarks/compute_threads_check.py [--rounds 4]

Prints tok/s medians per case; the embedded pair's target, 128 tokens per
generation, 2 threads. Each case runs in its own process (a pool, once made,
outlives the case)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys


def case(kind: str, release: bool, rounds: int) -> None:
    from pydflash import Llama, _core, embedded_pair

    if not release:
        _core.release_compute_threads = lambda: False  # type: ignore[assignment]
    target, drafter = embedded_pair()
    a = Llama(target, n_ctx=512, n_threads=2)
    b = Llama(target, draft=drafter, n_ctx=512, n_threads=2) if kind == "two" else None
    prompt = a.tokenize("def parse(text):\n    ")

    def tok_s(llm: Llama) -> float:
        r = llm.generate(prompt, max_tokens=128, ignore_eos=True, cache_prompt=False)
        return len(r.tokens) / r.stats.decode_seconds

    rates = []
    for _ in range(rounds):
        if b is not None:
            tok_s(b)
        else:
            a.pair.score(prompt)  # a direct call: this thread computes
        rates.append(tok_s(a))
    print(f"{statistics.median(rates):.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--case", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case:
        case(a.case[0], a.case[1] == "on", a.rounds)
        return 0
    print("case                                   released  not released  (target tok/s, medians)")
    for kind, label in (("two", "two Llamas in turn"), ("direct", "generate after pair.score on main")):
        out = {}
        for rel in ("on", "off"):
            cmd = [sys.executable, __file__, "--rounds", str(a.rounds), "--case", kind, rel]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[rel] = float(res.stdout.strip().splitlines()[-1])
        print(f"{label:38s} {out['on']:8.0f}  {out['off']:12.0f}  ({out['on'] / out['off']:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
