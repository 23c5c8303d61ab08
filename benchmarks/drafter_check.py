#!/usr/bin/env python3
"""Measure a drafter on chat prompts its trainer never saw: tau and acceptance at
a pinned draft length in pydflash (greedy, each output compared with the target
alone's), and llama.cpp's own loop (`llama-speculative-simple`, built by
tools/build_native.py) on the same files, which must load the drafter and draft.

    python benchmarks/drafter_check.py -m TARGET.gguf -d DRAFTER.gguf [--json OUT] [--native]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# written by hand for this check: none of them is a prompt the trainer wrote or read
PROMPTS = [
    "What are three good habits for staying focused while studying?",
    "Explain how a rainbow forms, in simple words.",
    "Write a short poem about autumn leaves.",
    "How do I make a cup of green tea properly?",
    "What is the difference between a virus and a bacterium?",
    "Give me some tips for a job interview.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in a few sentences.",
    "How can I save money on groceries?",
    "What is photosynthesis?",
    "Suggest a name for a small bakery and explain why.",
    "How does a computer store information?",
    "What should I pack for a weekend camping trip?",
    "Explain what a black hole is to a ten-year-old.",
    "What are the benefits of regular exercise?",
    "Write a polite email asking my manager for a day off.",
    "How do bees make honey?",
    "What is the capital of Australia, and what is it known for?",
    "Give me a simple recipe for pancakes.",
    "How can I improve my sleep?",
    "What causes the seasons on Earth?",
    "Describe a good way to learn a new language.",
    "What is the water cycle?",
    "Tell me a fun fact about octopuses.",
]


def pydflash_check(target: Path, drafter: Path, draft_max: int, max_tokens: int, threads: int | None) -> dict:
    from pydflash import Llama

    rows = []
    with Llama(target, n_ctx=2048, n_threads=threads) as alone, Llama(
        target, draft=drafter, n_ctx=2048, draft_max=draft_max, n_threads=threads
    ) as spec:
        for p in PROMPTS:
            prompt = alone.apply_chat_template([{"role": "user", "content": p}]).prompt
            tokens = alone.tokenize(prompt, special=True)
            want = alone.generate(tokens, max_tokens=max_tokens, temperature=0.0)
            got = spec.generate(tokens, max_tokens=max_tokens, temperature=0.0)
            rows.append({"prompt": p, "tau": got.stats.mean_accepted_length, "acceptance": got.stats.acceptance_rate,
                         "tokens": len(got.tokens), "steps": got.stats.n_steps, "identical": got.tokens == want.tokens})
    n_tok, n_steps = sum(r["tokens"] for r in rows), sum(r["steps"] for r in rows)
    return {"tau": n_tok / max(1, n_steps), "tau_median": statistics.median(r["tau"] for r in rows),
            "acceptance_mean": statistics.mean(r["acceptance"] for r in rows),
            "identical": all(r["identical"] for r in rows), "n_prompts": len(rows), "rows": rows}


def native_check(target: Path, drafter: Path, draft_max: int, max_tokens: int) -> dict:
    """llama.cpp's llama-speculative-simple on the first prompts: it loads the drafter and drafts."""
    exe = ROOT / "build" / "native" / "bin" / "llama-speculative-simple"
    if not exe.is_file():
        return {"skipped": f"{exe} is not built (python tools/build_native.py --target llama-speculative-simple)"}
    from pydflash import Llama

    drafted = accepted = 0
    with Llama(target, n_ctx=512) as llm, tempfile.TemporaryDirectory() as d:
        for p in PROMPTS[:6]:
            f = Path(d) / "prompt.txt"
            f.write_text(llm.apply_chat_template([{"role": "user", "content": p}]).prompt)
            cmd = [str(exe), "-m", str(target), "-md", str(drafter), "--spec-type", "draft-dflash",
                   "--spec-draft-n-max", str(draft_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                   "-f", str(f), "-n", str(max_tokens), "-c", "2048", "--temp", "0", "--top-k", "1", "-t", "2",
                   "-ngl", "0", "-ngld", "0", "-v"]  # fmt: skip
            # -v prints token pieces, and a piece may be part of a character
            out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
            if out.returncode != 0:
                return {"error": out.stderr[-2000:]}
            for a, n in re.findall(r"accepted (\d+)/(\d+) draft tokens", out.stdout + out.stderr):
                accepted += int(a)
                drafted += int(n)
    return {"drafted": drafted, "accepted": accepted, "acceptance": accepted / max(1, drafted), "prompts": 6}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("-d", "--draft", type=Path, required=True)
    ap.add_argument("--draft-max", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--native", action="store_true", help="also run llama.cpp's llama-speculative-simple")
    ap.add_argument("--json", type=Path, help="write the figures here (with the command)")
    a = ap.parse_args(argv)
    t0 = time.time()
    res = {"command": "python benchmarks/drafter_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "target": a.model.name, "drafter": a.draft.name, "draft_max": a.draft_max, "max_tokens": a.max_tokens,
           "pydflash": pydflash_check(a.model, a.draft, a.draft_max, a.max_tokens, a.threads)}  # fmt: skip
    if a.native:
        res["llama_speculative_simple"] = native_check(a.model, a.draft, a.draft_max, a.max_tokens)
    res["seconds"] = time.time() - t0
    p = res["pydflash"]
    print(f"tau {p['tau']:.2f} (median {p['tau_median']:.2f}) at draft_max {a.draft_max}, acceptance "
          f"{p['acceptance_mean']:.3f}, outputs identical to the target alone's: {p['identical']}")
    if "llama_speculative_simple" in res:
        print(f"llama-speculative-simple: {res['llama_speculative_simple']}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
