#!/usr/bin/env python3
"""The power of the sampling tests' chi-square checks against a sampler at the wrong
temperature (issue #63), computed from the exact distributions (no sampling of a model).

    PYTHONPATH=src:tests python tools/sampling_test_power.py \
        [--json benchmarks/results/sampling-test-power.json] [--reps 2000]

For each chi-square setting of tests/test_sampling.py and tests/test_grammar.py (there the
distribution is the target's under the grammar [a-e]+; tests/support/sampling.py's check:
the joint of the first two tokens and both marginals, cells of expected count < 5 pooled,
the test failing when the smallest of the three p-values is below ALPHA), the expected
distribution is the target's exact one, and the alternative is the same chain with the
temperature multiplied by 1.05, 1.10 or 1.25 (the cuts see the untempered row, so the
support is the same). Two numbers per factor and N:

* "simulated": the probability that the test's own decision rule fails, over ``--reps``
  multinomial samples of size N drawn from the alternative (exact for the rule up to the
  Monte Carlo error: at most 1.1 percentage points, one standard error, at 2000 repetitions);
  the kept settings are chosen by it;
* "analytic": for each of the three checks, the noncentral chi-square approximation of its
  power (noncentrality N * sum (p1 - p0)^2 / p0 over the pooled cells), and the largest of
  them, which approximates a lower bound on the rule's power (failing any check fails it);
  rough where many cells are small.

Each setting is given at N = 1000, 2000, 4000 and 8000 (the pooling of small cells changes
with N, so the power is not monotonic in it), with the N its test uses ("n_used"; none for
a setting taken out of the chi-square matrix for lack of power). The position-0 and joint
chi-square checks of tests/test_block_sampling.py (N = 600, Bonferroni alpha 1e-4 / (k + 3))
are given the analytic way only: there they are two checks of a family whose rank checks
add power.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

FACTORS = (1.05, 1.10, 1.25)
THRESHOLD = 0.9  # the power a kept setting must have at temperature x1.25


def cells(probs: dict, n: int) -> tuple[list, list]:
    """The test's categories: keys of expected count >= 5 alone, the rest pooled (as
    support.sampling.chi_square_pvalue): [(keys...)], and their probabilities."""
    alone = [k for k, p in probs.items() if p * n >= 5]
    pooled = [k for k, p in probs.items() if p * n < 5]
    groups = [[k] for k in alone] + ([pooled] if pooled else [])
    return groups, [sum(probs[k] for k in g) for g in groups]


def marginal(joint: dict, axis: int) -> dict:
    out: dict = {}
    for k, p in joint.items():
        out[k[axis]] = out.get(k[axis], 0.0) + p
    return out


def analytic_power(p0: list, p1: list, n: int, alpha: float) -> float:
    p0a, p1a = np.array(p0) / sum(p0), np.array(p1) / sum(p1)
    df = len(p0a) - 1
    if df < 1:
        return 0.0
    lam = n * float(np.sum((p1a - p0a) ** 2 / p0a))
    return float(stats.ncx2.sf(stats.chi2.isf(alpha, df), df, lam))


def rule_checks(exact: dict, n: int) -> list[tuple[list, list, dict]]:
    """The three checks: (cell groups, expected probabilities, key -> joint keys)."""
    out = []
    for view in ("joint", 0, 1):
        probs = exact if view == "joint" else marginal(exact, view)
        groups, p = cells(probs, n)
        out.append((groups, p, view))
    return out


def project(dist: dict, groups: list, view) -> list:
    probs = dist if view == "joint" else marginal(dist, view)
    return [sum(probs.get(k, 0.0) for k in g) for g in groups]


def simulated_power(exact: dict, alt: dict, n: int, alpha: float, reps: int, rng, chunk: int = 100) -> float:
    """The rule's failure rate on multinomial samples from ``alt``, drawn over the joint
    keys grouped by the cell each of the three checks puts them in (the same counts)."""
    keys = list(exact)
    checks = []
    for groups, p0, view in rule_checks(exact, n):
        index = {k: gi for gi, g in enumerate(groups) for k in g}
        checks.append(([index[k if view == "joint" else k[view]] for k in keys], np.array(p0) / sum(p0) * n))
    cell_of = {}
    for ki, triple in enumerate(zip(*(c for c, _ in checks), strict=True)):
        cell_of.setdefault(triple, []).append(ki)
    triples = list(cell_of)
    p_alt = np.array([sum(alt.get(keys[ki], 0.0) for ki in cell_of[t]) for t in triples])
    p_alt /= p_alt.sum()
    sums = []  # per check: the refined cells in its cells' order, and where each cell starts
    for c, (_, e) in enumerate(checks):
        cell = np.array([t[c] for t in triples])
        order = np.argsort(cell, kind="stable")
        sums.append((order, np.searchsorted(cell[order], np.arange(len(e))), e))
    fails = 0
    for start in range(0, reps, chunk):
        draws = rng.multinomial(n, p_alt, size=min(chunk, reps - start))  # (chunk, refined cells)
        fail = np.zeros(len(draws), dtype=bool)
        for order, starts, e in sums:
            obs = np.add.reduceat(draws[:, order], starts, axis=1)
            fail |= stats.chi2.sf(((obs - e) ** 2 / e).sum(axis=1), len(e) - 1) < alpha
        fails += int(fail.sum())
    return fails / reps


def sampling_rows(reps: int, rng) -> dict:
    from pydflash import Llama, gguf_writers
    from support.models import SPREAD
    from support.sampling import (
        ALPHA,
        GRAMMAR_SETTINGS,
        N_OF,
        NO_POWER,
        PROMPT,
        SETTINGS,
        N,
        exact_constrained_joint,
        exact_joint,
    )

    out = {}
    with tempfile.TemporaryDirectory() as d:
        t = gguf_writers.write_target(Path(d) / "t.gguf", SPREAD)
        with Llama(t, n_ctx=256, n_threads=1) as base:
            grammar = {f"grammar-{k}": v for k, v in GRAMMAR_SETTINGS.items()}  # tests/test_grammar.py's
            for name, kw in {**SETTINGS, **NO_POWER, **grammar}.items():

                def joint(kw: dict, name: str = name) -> dict:
                    if name in grammar:
                        return exact_constrained_joint(base, **kw)
                    return exact_joint(base, PROMPT, 64, **kw)

                exact = joint(kw)
                n_used = N_OF.get(name, N) if name in SETTINGS else None
                row: dict = {
                    "sampling": {k: (list(v.items()) if isinstance(v, dict) else v) for k, v in kw.items()},
                    "joint_cells": len(exact),
                    "kept": name in SETTINGS,
                    "n_used": n_used,
                    "power": {},
                }
                for f in FACTORS:
                    alt = joint({**kw, "temperature": kw["temperature"] * f})
                    per_n = {}
                    for n in (1000, 2000, 4000, 8000):
                        comps = [analytic_power(p0, project(alt, g, v), n, ALPHA) for g, p0, v in rule_checks(exact, n)]
                        per_n[str(n)] = {
                            "simulated": simulated_power(exact, alt, n, ALPHA, reps, rng),
                            "analytic_joint_m0_m1": [round(c, 4) for c in comps],
                            "analytic_lower_bound": round(max(comps), 4),
                        }
                    row["power"][f"x{f:.2f}"] = per_n
                if n_used:
                    row["simulated_power_at_n_used"] = {f: v[str(n_used)]["simulated"] for f, v in row["power"].items()}
                out[name] = row
                print(name, json.dumps(row.get("simulated_power_at_n_used")), flush=True)
    return out


def first_two(base, kw: dict, n: int) -> tuple[np.ndarray, dict]:
    """The block tests' exact first-token distribution and joint (support.blocks)."""
    from support import blocks

    def row(ctx: list[int]) -> np.ndarray:
        return blocks.transform(base.pair.score(ctx)[-1], ctx, **kw)

    p0 = row(blocks.PROMPT)
    return p0, blocks.exact_first_two(p0, lambda t0: row([*blocks.PROMPT, t0]), n)


def block_rows() -> dict:
    from pydflash import Llama, gguf_writers
    from support import blocks

    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, (tspec, dspec) in blocks.DRAFTERS.items():
            t = Path(d) / f"{name}.gguf"
            hybrid = isinstance(tspec, gguf_writers.HybridSpec)
            (gguf_writers.write_hybrid_target if hybrid else gguf_writers.write_target)(t, tspec)
            alpha = blocks.FAMILY_ALPHA / (dspec.block_size - 1 + 3)  # Bonferroni over the k + 3 checks
            kw = blocks.TOPK if name == "spread-b8" else blocks.PLAIN
            with Llama(t, n_ctx=256, n_threads=1) as base:
                p0, joint = first_two(base, kw, blocks.N)
                row: dict = {"n": blocks.N, "alpha_per_check": alpha, "power": {}}
                for f in FACTORS:
                    a0, alt = first_two(base, {**kw, "temperature": kw["temperature"] * f}, blocks.N)
                    # the alternative on the exact distribution's cells (its lumped first tokens too)
                    alt_cells = {k: (float(a0[k[0]]) if k[1] == -1 else alt.get(k, 0.0)) for k in joint}
                    powers = {}
                    for what, exact, other in (
                        ("position0", {int(t): float(p0[t]) for t in np.flatnonzero(p0 > 0)}, dict(enumerate(a0))),
                        ("joint01", joint, alt_cells),
                    ):
                        g, e = cells(exact, blocks.N)
                        powers[what] = round(
                            analytic_power(e, [sum(other.get(k, 0.0) for k in gg) for gg in g], blocks.N, alpha), 4
                        )
                    row["power"][f"x{f:.2f}"] = powers
                out[name] = row
                print(name, json.dumps(row["power"]), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=63)
    a = ap.parse_args(argv)
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    result = {
        "command": "PYTHONPATH=src:tests python tools/sampling_test_power.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "what": "power of the sampling tests' chi-square checks against temperature x1.05 / x1.10 / x1.25",
        "threshold": f"a kept chi-square setting has simulated power >= {THRESHOLD} at x1.25 at its N",
        "test_sampling": sampling_rows(a.reps, rng),
        "test_block_sampling_chi_square_parts": block_rows(),
        "reps": a.reps,
        "python": platform.python_version(),
        "seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(result, indent=1)
    if a.json:
        a.json.write_text(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
