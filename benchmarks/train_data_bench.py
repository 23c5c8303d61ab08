#!/usr/bin/env python3
"""What a training chunk's data costs: the target's greedy replies and their features made
in one pass per token (``FeatureCapture.generate``, what ``pydflash train-drafter`` does)
against two passes (``Llama.generate_batch``, then ``FeatureCapture.capture`` over each
prompt + reply), or (``--against-parallel N``) one pass with ``--parallel`` sequences at once
against one pass with N; the two ways alternate round by round on the same prompts. Each way is
also split into halves of its rounds (odd against even) for the noise band.

    python benchmarks/train_data_bench.py -m TARGET.gguf [--prompts 16] [--max-new 256] \
        [--parallel 8] [--against-parallel 16] [--rounds 3] [--json out.json]

Prompts: chat questions rendered with the target's own template."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pydflash import Llama, _core

QUESTIONS = [
    "How do plants make their food?", "Write a short poem about the sea.", "What is a prime number?",
    "Explain how a bicycle stays upright.", "Give me three tips for learning a language.",
    "What causes the seasons?", "Describe a good breakfast.", "Why is the sky blue?",
    "How does a refrigerator work?", "What is the capital of France and why is it famous?",
    "Summarize the story of Cinderella.", "How do I boil an egg?", "What are clouds made of?",
    "Tell me about the history of the printing press.", "Why do cats purr?", "How does rain form?",
    "What is photosynthesis?", "Explain gravity to a child.", "List some healthy snacks.",
    "What is the difference between weather and climate?", "How do vaccines work?",
    "Write a haiku about autumn.", "What makes a good friend?", "How are rainbows made?",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--against-parallel", type=int, help="compare one pass at --parallel with one pass at N")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layers", default="", help="target layer ids, comma-separated (default: 3 spread out)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    per_seq = 128 + a.max_new
    other = a.against_parallel
    with Llama(a.model, n_ctx=a.parallel * per_seq, n_parallel=a.parallel) as llm:
        n_layer = llm.core_model.n_layer
        layers = [int(x) for x in a.layers.split(",")] if a.layers else [1, n_layer // 2, n_layer - 2]
        prompts = [
            llm.tokenize(llm.apply_chat_template([{"role": "user", "content": q}]).prompt, special=True)
            for q in (QUESTIONS * (1 + a.prompts // len(QUESTIONS)))[: a.prompts]
        ]
        cap = _core.FeatureCapture(llm.core_model, layers, per_seq, 512, 0, a.parallel)
        cap_other = _core.FeatureCapture(llm.core_model, layers, per_seq, 512, 0, other) if other else None

        def one_pass(c: _core.FeatureCapture) -> list[list[int]]:
            return [r.tolist() for r, _ in c.generate(prompts, a.max_new)]

        def two_pass() -> list[list[int]]:
            replies = [list(r.tokens) for r in llm.generate_batch(prompts, max_tokens=a.max_new, temperature=0)]
            for p, r in zip(prompts, replies, strict=True):
                cap.capture(p + r, 0)
            return replies

        if cap_other is None:
            ways = {"two-pass": two_pass, "one-pass": lambda: one_pass(cap)}
        else:
            ways = {f"one-pass x{a.parallel}": lambda: one_pass(cap), f"one-pass x{other}": lambda: one_pass(cap_other)}
        base, new = list(ways)
        rows: list[dict[str, float | int | str]] = []
        for rnd in range(a.rounds):
            for way in (base, new) if rnd % 2 == 0 else (new, base):
                t0 = time.perf_counter()
                replies = ways[way]()
                dt = time.perf_counter() - t0
                n = sum(len(p) + len(r) for p, r in zip(prompts, replies, strict=True))
                rows.append({"round": rnd, "way": way, "seconds": dt, "tokens": n, "tok_s": n / dt})
                print(f"round {rnd} {way}: {n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s", flush=True)

    def med(way: str, half: int | None = None) -> float:
        return statistics.median(
            float(r["tok_s"]) for r in rows if r["way"] == way and (half is None or int(r["round"]) % 2 == half)
        )

    ratio = med(new) / med(base)
    noise = {w: med(w, 0) / med(w, 1) for w in (new, base)} if a.rounds >= 2 else {}
    print(f"{new} / {base}, data tok/s: {ratio:.2f}x (medians over {a.rounds} rounds)")
    for w, v in noise.items():
        print(f"noise band, {w} against itself (even rounds / odd rounds): {v:.3f}x")
    if a.json:
        out = {"command": "python benchmarks/train_data_bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "prompts": a.prompts, "max_new": a.max_new, "parallel": a.parallel, "layers": layers,
               "rows": rows, "compared": f"{new} over {base}", "ratio": ratio, "noise_band": noise}  # fmt: skip
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
