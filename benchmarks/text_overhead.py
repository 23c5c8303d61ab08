#!/usr/bin/env python3
"""Per-token cost of stream text assembly (pydflash.engine.text.TextAssembler) as the
output grows: flat when the work per token does not depend on the length.

    python benchmarks/text_overhead.py [--lengths 128 512 2048 8192]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from pydflash.engine.text import TextAssembler

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "def", "return", "import", "class"]
WORDS += ["é", "漢字", "🙂"]
PIECES = [w.encode() for w in WORDS]
PIECES += [b" ", b"\n", "é".encode()[:1], "é".encode()[1:]]


def us_per_token(n: int, stop: list[str], rng: random.Random) -> float:
    tokens = [rng.randrange(len(PIECES)) for _ in range(n)]
    asm = TextAssembler(PIECES.__getitem__, stop)
    t0 = time.perf_counter()
    for t in tokens:  # one token per step, as in target-only decoding
        asm.add(t)
        if asm.stop_strings:
            asm.find_stop()
        asm.release(final=False)
    asm.release(final=True)
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    print(f"{'tokens':>8} {'us/token':>10} {'us/token, 2 stop strings':>26}   (median of {args.repeats})")
    for n in args.lengths:
        plain = statistics.median(us_per_token(n, [], rng) for _ in range(args.repeats))
        stops = statistics.median(us_per_token(n, ["</s>", "<|im_end|>"], rng) for _ in range(args.repeats))
        print(f"{n:>8} {plain:>10.2f} {stops:>26.2f}")


if __name__ == "__main__":
    main()
