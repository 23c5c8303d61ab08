#!/usr/bin/env python3
"""One stream, two pydflash builds side by side: decode tok/s of each on the
same model files and prompts, the builds alternating run by run (two Python
interpreters, e.g. a venv with the previous commit installed and one with this
checkout's). Greedy, EOS ignored, so every run generates exactly OSL tokens.

    python benchmarks/ab_single_stream.py --python-a OLD/bin/python --python-b NEW/bin/python \
        [--rounds 5] [--isl 128] [--osl 128] [--stop TEXT] [--json out.json]

Model: the embedded pair with its target's FFN zero-padded to 16384 (the
memory-bound copy `pydflash bench` uses), unless -m/-d are given."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# run in each interpreter: load once, warm up, then time each prompt's generation
WORKER = r"""
import json, sys, time
from pydflash import Llama
target, draft, prompts, osl = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
stop = json.loads(sys.argv[5])
with Llama(target, draft=draft, n_ctx=2048) as llm:
    llm.generate(prompts[0], max_tokens=16, ignore_eos=True, cache_prompt=False)
    out = []
    for p in prompts:
        r = llm.generate(p, max_tokens=osl, ignore_eos=True, cache_prompt=False, stop=stop)
        out.append({"decode_s": r.stats.decode_seconds, "n": len(r.tokens), "tokens": r.tokens,
                    "accepted": r.stats.n_accepted, "steps": r.stats.n_steps})
print(json.dumps(out))
"""


def run(python: str, target: str, draft: str, prompts: list[str], osl: int, stop: list[str]) -> list[dict]:
    res = subprocess.run([python, "-c", WORKER, target, draft, json.dumps(prompts), str(osl), json.dumps(stop)],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python-a", required=True, help="interpreter with build A (the reference)")
    ap.add_argument("--python-b", required=True, help="interpreter with build B")
    ap.add_argument("-m", "--model")
    ap.add_argument("-d", "--draft")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--stop", action="append", default=[],
                    help="a stop string for every generation (repeatable; one that never occurs measures the search)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    import pydflash
    from pydflash import Llama
    from pydflash.bench.workload import heldout_stdlib_text, make_prompts, text_codec
    from pydflash.gguf_writers.padding import pad_ffn

    if a.model:
        target, draft = a.model, a.draft
    else:
        t, draft = pydflash.embedded_pair()
        target = str(pad_ffn(t, Path(tempfile.mkdtemp()) / "target-padded.gguf", 16384))
    with Llama(target, n_ctx=256) as llm:
        prompts = make_prompts(*text_codec(llm), a.isl, a.prompts, heldout_stdlib_text())
    rates: dict[str, list[float]] = {"a": [], "b": []}
    outputs: dict[str, list[list[int]]] = {}
    for i in range(a.rounds):
        for key in ("a", "b") if i % 2 == 0 else ("b", "a"):
            runs = run(getattr(a, f"python_{key}"), target, str(draft), prompts, a.osl, a.stop)
            rate = sum(r["n"] for r in runs) / sum(r["decode_s"] for r in runs)
            rates[key].append(rate)
            outputs[key] = [r["tokens"] for r in runs]
            print(f"round {i + 1} build {key}: {rate:.1f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    same = outputs["a"] == outputs["b"]
    print(f"median decode tok/s: A {med['a']:.1f}, B {med['b']:.1f}; B/A {med['b'] / med['a']:.3f}; "
          f"identical outputs: {same}")
    if a.json:
        a.json.write_text(json.dumps({
            "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
            "isl": a.isl, "osl": a.osl, "prompts": a.prompts, "rounds": a.rounds, "stop": a.stop,
            "tok_s": rates, "median": med, "ratio_b_over_a": med["b"] / med["a"], "identical_outputs": same,
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
