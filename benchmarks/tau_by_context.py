#!/usr/bin/env python3
"""Measure a pair's tau (tokens per target pass) against context length: for each
prompt length, several held-out standard-library code fragments of exactly that
many tokens, greedy, EOS ignored, at one pinned draft length; every output is
compared with the target alone's (where one departs: the target's own top-two
logprob gap at that token, a near-tie or not). tau and acceptance do not depend on the
machine's speed, so a busy machine gives the same figures.

    python benchmarks/tau_by_context.py [-m TARGET -d DRAFTER] [--isl 16,32,...] [--osl 64]
        [--prompts 8] [--draft-max 7] [--json OUT]

Without -m/-d it measures the shipped pair (`pydflash.embedded_pair()`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydflash import Llama, embedded_pair
from pydflash.bench.workload import heldout_stdlib_text, make_prompts, text_codec


def measure(llm: Llama, prompts: list[str], osl: int, draft_max: int) -> dict[str, object]:
    """One context length: pooled tau and acceptance, per-prompt tau, and identity with the target alone."""
    tokens = steps = drafted = accepted = identical = 0
    per_prompt: list[float] = []
    departures: list[dict[str, object]] = []
    for n, p in enumerate(prompts):
        ref = llm.generate(
            p, max_tokens=osl, ignore_eos=True, draft_max=0, cache_prompt=False, logprobs=True, top_logprobs=2
        )
        out = llm.generate(p, max_tokens=osl, ignore_eos=True, draft_max=draft_max, cache_prompt=False)
        identical += out.tokens == ref.tokens
        if out.tokens != ref.tokens:
            # where the outputs part: the target's own top two there (a near-tie that a
            # k-token verification and a 1-token decode round apart, or a real departure)
            i = next(k for k, (a, b) in enumerate(zip(out.tokens, ref.tokens, strict=True)) if a != b)
            top = ref.logprobs[i].top if ref.logprobs else ()
            gap = top[0][1] - top[1][1] if len(top) > 1 else None
            departures.append(
                {
                    "prompt": n,
                    "position": i,
                    "target_token": ref.tokens[i],
                    "pair_token": out.tokens[i],
                    "target_top2_logprob_gap": gap,
                }
            )
        st = out.stats
        tokens += st.n_tokens
        steps += st.n_steps
        drafted += st.n_drafted
        accepted += st.n_accepted
        per_prompt.append(st.mean_accepted_length)
    return {
        "tau": tokens / steps,
        "tau_median": statistics.median(per_prompt),
        "tau_per_prompt": per_prompt,
        "acceptance": accepted / drafted if drafted else 0.0,
        "identical": identical,
        "prompts": len(prompts),
        "departures": departures,
    }


def prompts_of(
    tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str], isl: int, count: int, corpus: str
) -> list[str]:
    """Up to ``count`` prompts of ``isl`` tokens: fewer where the held-out corpus has no
    room for that many distinct windows (the longest lengths)."""
    while True:
        try:
            return make_prompts(tokenize, detokenize, isl, count, corpus)
        except RuntimeError:
            if count == 1:
                raise
            count //= 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="target GGUF (default: the shipped pair)")
    ap.add_argument("-d", "--draft", help="DFlash drafter GGUF (with -m)")
    ap.add_argument("--isl", default="16,32,64,128,256,512,1024,2048,4096", help="prompt lengths in tokens")
    ap.add_argument("--osl", type=int, default=64, help="tokens generated per prompt")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per length")
    ap.add_argument("--draft-max", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if (a.model is None) != (a.draft is None):
        ap.error("-m and -d go together")
    isls = [int(x) for x in a.isl.split(",")]
    n_ctx = max(isls) + a.osl + 64
    kw = {"n_ctx": n_ctx, "n_batch": 2048, "n_threads": a.threads}
    target, draft = (a.model, a.draft) if a.model else embedded_pair()
    llm = Llama(target, draft=draft, **kw)
    tokenize, detokenize = text_codec(llm)
    corpus = heldout_stdlib_text()
    rows = []
    t0 = time.monotonic()
    with llm:
        for isl in isls:
            row = {
                "isl": isl,
                **measure(llm, prompts_of(tokenize, detokenize, isl, a.prompts, corpus), a.osl, a.draft_max),
            }
            rows.append(row)
            print(
                f"ISL {isl:5d}: tau {row['tau']:.2f} (median {row['tau_median']:.2f}), "
                f"acceptance {row['acceptance']:.1%}, identical {row['identical']}/{row['prompts']}",
                flush=True,
            )
    out = {
        "command": "python benchmarks/tau_by_context.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "pair": "shipped (pydflash.embedded_pair())" if a.model is None else {"target": a.model, "draft": a.draft},
        "osl": a.osl,
        "draft_max": a.draft_max,
        "workload": "held-out standard-library code",
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "rows": rows,
    }
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
