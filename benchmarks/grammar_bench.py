"""What a JSON-schema grammar costs under speculation, on the embedded pair.

Each prompt is decoded greedily with DFlash with and without a JSON-schema grammar,
the two alternating run by run. A grammar changes what is generated, and so the
acceptance; the cost per target pass (decode time / verification passes) compares the
two at equal acceptance: decode tok/s = tau / time per pass. Reported per mode: decode
tok/s, tau (tokens per target pass), acceptance, ms per pass; medians over prompts and
repeats, and the ratios.

    python benchmarks/grammar_bench.py --json benchmarks/results/grammar-overhead-cpu-2core.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

from pydflash import Llama, embedded_pair

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "version": {"type": "string", "maxLength": 12},
        "dependencies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "private": {"type": "boolean"},
    },
    "required": ["name", "version", "dependencies"],
}
PROMPTS = [
    "package = ",
    "# the package manifest\nmanifest = ",
    "def load_config():\n    return ",
    "DEFAULTS = ",
    "metadata = json.loads('",
    "record = dict(",
]


def cold_schema(n: int) -> dict[str, object]:
    """SCHEMA with another bound: another grammar text, so nothing is cached for it yet."""
    schema = json.loads(json.dumps(SCHEMA))
    schema["properties"]["name"]["maxLength"] = 1000 + n
    return schema


def run(llm: Llama, prompt: str, max_tokens: int, mode: str, n: int = 0) -> dict[str, float]:
    kw = {"plain": {}, "json_schema": {"json_schema": SCHEMA}, "json_schema_cold": {"json_schema": cold_schema(n)}}
    r = llm.generate(prompt, max_tokens=max_tokens, cache_prompt=False, **kw[mode])
    s = r.stats
    return {
        "tok_s": s.decode_tokens_per_second,
        "tau": s.mean_accepted_length,
        "acceptance": s.acceptance_rate,
        "ms_per_pass": 1e3 * s.decode_seconds / max(s.n_steps, 1),
        "tokens": s.n_tokens,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    target, drafter = embedded_pair()
    modes = ("plain", "json_schema", "json_schema_cold")
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    n = 0
    with Llama(target, draft=drafter, n_ctx=1024) as llm:
        run(llm, PROMPTS[0], 16, "plain")  # warm-up (the grammar's cache is not warmed)
        for rep in range(a.repeats):
            for prompt in PROMPTS:
                for mode in modes if rep % 2 == 0 else modes[::-1]:
                    n += 1
                    rows[mode].append(run(llm, prompt, a.max_tokens, mode, n))
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
    ratio = {
        m: {
            "tok_s": med[m]["tok_s"] / med["plain"]["tok_s"],
            "ms_per_pass": med[m]["ms_per_pass"] / med["plain"]["ms_per_pass"],
            "tok_s_at_equal_acceptance": med["plain"]["ms_per_pass"] / med[m]["ms_per_pass"],
        }
        for m in modes[1:]
    }
    out = {
        "command": "python benchmarks/grammar_bench.py" + (f" --json {a.json}" if a.json else ""),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg()},
        "pair": "embedded (stdlib-code qwen3 target + DFlash drafter), greedy, n_ctx 1024",
        "prompts": PROMPTS,
        "repeats": a.repeats,
        "max_tokens": a.max_tokens,
        "median": med,
        "ratio_over_plain": ratio,
    }
    print(json.dumps({"median": med, "ratio": ratio}, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
