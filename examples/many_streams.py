"""Several generations at once on one model: submitted from asyncio (the event
loop keeps running), each streamed as it goes, batched by the engine into
shared speculative steps.

    python examples/many_streams.py                           # the embedded pair
    python examples/many_streams.py TARGET.gguf DRAFTER.gguf --parallel 4
"""

from __future__ import annotations

import argparse
import asyncio

import pydflash
from pydflash import Llama

PROMPTS = ["def quicksort(items):\n", "class LRUCache:\n", "import json\n\ndef load(path):\n", "for line in"]


async def one(llm: Llama, prompt: str, max_tokens: int) -> str:
    text = ""
    async for step in llm.submit(prompt, max_tokens=max_tokens):
        text += step.text  # arrives as the step is done, while the others run
    return text


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("drafter", nargs="?")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    if a.target is None:
        a.target, a.drafter = pydflash.embedded_pair()

    with Llama(a.target, draft=a.drafter, n_ctx=1024 * a.parallel, n_parallel=a.parallel) as llm:
        texts = await asyncio.gather(*(one(llm, p, a.max_tokens) for p in PROMPTS))
        for prompt, text in zip(PROMPTS, texts, strict=True):
            print(f"--- {prompt}{text}")
        # the same from plain (threaded) code: one call, results in order; greedy, so
        # the same texts, whatever ran beside each
        batch = llm.generate_batch(PROMPTS, max_tokens=a.max_tokens)
        print("generate_batch, same texts:", [r.text for r in batch] == texts)
        shared = max(s.n_batch_seqs for r in batch for s in r.stats.steps)
        print(f"up to {shared} sequences shared a speculative step")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
