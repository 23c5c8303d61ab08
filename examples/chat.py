"""Chat with a target + DFlash drafter through the model's chat template, as
with llama-cpp-python's ``create_chat_completion``, and show DFlash's numbers.

    python examples/chat.py                                   # the embedded pair
    python examples/chat.py TARGET.gguf DRAFTER.gguf "Write a function that reverses a list."
"""

from __future__ import annotations

import argparse

import pydflash
from pydflash import Llama


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", nargs="?")
    ap.add_argument("drafter", nargs="?")
    ap.add_argument("question", nargs="?", default="def is_palindrome(s):")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-thinking", action="store_true", help="turn reasoning off (templates that have it)")
    a = ap.parse_args()
    if a.target is None:
        a.target, a.drafter = pydflash.embedded_pair()

    with Llama(a.target, draft=a.drafter, n_ctx=2048) as llm:
        messages = [
            {"role": "system", "content": "You are a helpful Python programmer."},
            {"role": "user", "content": a.question},
        ]
        print("prompt the template made:\n" + llm.apply_chat_template(messages).prompt)
        res = llm.create_chat_completion(messages, max_tokens=a.max_tokens, temperature=0.0,
                                         enable_thinking=not a.no_thinking)
        msg = res["choices"][0]["message"]
        if msg.get("reasoning_content"):
            print("reasoning:\n" + msg["reasoning_content"])
        print("assistant:\n" + (msg["content"] or ""))
        t = res["timings"]
        rate = t["draft_n_accepted"] / t["draft_n"] if t["draft_n"] else 0.0
        print(f"\nusage: {res['usage']}")
        print(f"DFlash: drafted {t['draft_n']}, accepted {t['draft_n_accepted']} ({rate:.0%}), "
              f"{t['predicted_n']} tokens in {t['n_steps']} target passes, {t['predicted_per_second']:.1f} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
