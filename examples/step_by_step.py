"""Drive DFlash decoding one speculative step at a time with the low-level API.

    python examples/step_by_step.py                          # the shipped pair
    python examples/step_by_step.py TARGET.gguf DRAFTER.gguf "def fib(n):"

Each step drafts a block with the DFlash drafter, verifies it in one target
pass, and keeps the agreeing prefix plus one token of the target's own.
"""

from __future__ import annotations

import argparse

import pydflash
from pydflash import Llama


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("drafter", nargs="?")
    ap.add_argument("prompt", nargs="?", default="def fibonacci(n):\n")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--draft-max", type=int, default=None)
    a = ap.parse_args()
    if a.target is None:
        a.target, a.drafter = pydflash.embedded_pair()  # trained on Python code: it writes Python

    with Llama(a.target, a.drafter, n_ctx=1024) as llm:
        pair = llm.pair
        ms = pair.prefill(llm.tokenize(a.prompt.encode()))
        print(f"prefill: {pair.n_past} tokens in {ms:.1f} ms; block size {pair.block_size}")
        generated: list[int] = []
        for i in range(a.steps):
            step = pair.step(a.draft_max)
            generated += step.tokens
            print(f"step {i:2d}: drafted {step.n_drafted} accepted {step.n_accepted} "
                  f"-> {step.tokens} (draft {step.t_draft_ms:.2f} ms, verify {step.t_verify_ms:.2f} ms, "
                  f"inject {step.t_inject_ms:.2f} ms)")
        # the same tokens as plain greedy decoding, with fewer target passes
        text = llm.detokenize(generated).decode("utf-8", errors="replace")
        print(f"{len(generated)} tokens in {a.steps} target passes:\n{a.prompt}{text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
