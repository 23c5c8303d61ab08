"""Stream a chat reply chunk by chunk (OpenAI-style chunks), then print how
many tokens each speculative step accepted.

    python examples/streaming.py                              # the embedded pair
    python examples/streaming.py TARGET.gguf DRAFTER.gguf "class Stack:"
"""

from __future__ import annotations

import argparse
import sys

import pydflash
from pydflash import Llama


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("drafter", nargs="?")
    ap.add_argument("prompt", nargs="?", default="class Stack:\n    def __init__(self):\n")
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    if a.target is None:
        a.target, a.drafter = pydflash.embedded_pair()

    with Llama(a.target, draft=a.drafter, n_ctx=2048) as llm:
        # plain text completion, streamed
        last = None
        sys.stdout.write(a.prompt)
        for chunk in llm.create_completion(a.prompt, max_tokens=a.max_tokens, temperature=0.0, stream=True):
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
            last = chunk
        assert last is not None
        t = last["timings"]
        print(f"\n\nfinish_reason={last['choices'][0]['finish_reason']} usage={last['usage']}")
        print(f"accepted draft tokens per step: {last['speculative']['accepted_lengths']}")
        print(f"tau = {t['predicted_n'] / max(t['n_steps'], 1):.2f} tokens per target pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
