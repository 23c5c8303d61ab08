"""Second turn of a conversation with and without the prompt cache.

Turn 1 is a held-out standard-library prompt and a greedy reply; turn 2 is
turn 1's prompt, the reply and new text (as a chat history grows). It is
decoded with ``cache_prompt=True`` (the default: only the new tokens are
prefilled) and ``cache_prompt=False`` (the whole history again), alternating
run by run, on the memory-bound padded copy of the embedded target with its
drafter. Time to first token is measured the way a streaming user sees it:
from the call to the first streamed step with text.

    python benchmarks/prompt_cache_bench.py --json benchmarks/results/prompt-cache-cpu-2core.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from pydflash import Llama, embedded_pair
from pydflash.bench.workload import heldout_stdlib_text
from pydflash.gguf_writers.padding import pad_ffn


def ttft(llm: Llama, prompt: list[int], cache: bool, max_tokens: int) -> tuple[float, int, list[int]]:
    """Seconds to the first streamed tokens, the cached token count and the tokens."""
    t0 = time.perf_counter()
    first = None
    out: list[int] = []
    for step in llm.stream(prompt, max_tokens=max_tokens, ignore_eos=True, cache_prompt=cache):
        if first is None and step.tokens:
            first = time.perf_counter() - t0
        out += step.tokens
    assert first is not None
    return first, llm.pair.n_cached, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=int, default=1400, help="turn-1 prompt tokens (default: %(default)s)")
    ap.add_argument("--reply", type=int, default=164, help="turn-1 reply tokens (default: %(default)s)")
    ap.add_argument("--new", type=int, default=101, help="new turn-2 tokens (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pad-ffn", type=int, default=16384, help="FFN width of the target copy (0: as is)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()

    target, draft = embedded_pair()
    with tempfile.TemporaryDirectory() as tmp:
        if a.pad_ffn:
            target = str(pad_ffn(target, Path(tmp) / "padded.gguf", a.pad_ffn))
        with Llama(target, draft=draft, n_ctx=4096, n_threads=a.threads) as llm:
            ids = llm.tokenize(heldout_stdlib_text())
            turn1 = ids[: a.history]
            reply = llm.generate(turn1, max_tokens=a.reply, ignore_eos=True).tokens
            new = ids[a.history: a.history + a.new]
            turn2 = turn1 + reply + new
            rows: dict[str, list[float]] = {"cached": [], "uncached": []}
            cached_n: set[int] = set()
            outputs = []
            for _ in range(a.repeats):
                for label, cache in (("cached", True), ("uncached", False)):
                    llm.generate(turn1, max_tokens=a.reply, ignore_eos=True, cache_prompt=False)  # turn 1 again
                    s, n, out = ttft(llm, turn2, cache, max_tokens=16)
                    rows[label].append(s)
                    outputs.append(out)
                    if cache:
                        cached_n.add(n)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "command": "python benchmarks/prompt_cache_bench.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v is not None and k != "json"),
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "turn2_prompt_tokens": len(turn2), "cached_tokens": sorted(cached_n),
        "ttft_s": rows, "ttft_median_s": med, "speedup": med["uncached"] / med["cached"],
        "same_output": all(o == outputs[0] for o in outputs),
    }
    print(f"turn 2: {len(turn2)} prompt tokens, {sorted(cached_n)} from the cache")
    print(f"TTFT median: cached {med['cached']:.3f} s, uncached {med['uncached']:.3f} s "
          f"({result['speedup']:.1f}x); same output: {result['same_output']}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
