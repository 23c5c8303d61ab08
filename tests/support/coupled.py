"""verify="coupled" output checked against the target alone's, where a near-tie of
log p + g may let either token out (tests/test_coupled.py's docstring)."""

from __future__ import annotations

import numpy as np

from pydflash import Llama, _core
from support.blocks import WINDOW
from support.sampling import transform

# in units of log p + g: a tiny model's logits move by up to ~0.35 between batchings
# (test_parallel.py); at T = 0.8 that is 0.44
TIE_BOUND = 0.5


def perturbed_gap(base: Llama, prefix: list[int], a: int, b: int, seed: int, kw: dict) -> float:
    """|(log p + g)(a) - (log p + g)(b)| at the position after ``prefix`` (full-prefix row)."""
    p = transform(base.pair.score(prefix)[-1], prefix[-WINDOW:], **kw)  # the penalties' window
    g = _core.coupled_gumbel(seed, len(prefix), [a, b])
    with np.errstate(divide="ignore"):
        return abs(float(np.log(p[a]) + g[0] - np.log(p[b]) - g[1]))


def assert_same_or_near_tie(
    base: Llama, prompt: list[int], got: list[int], want: list[int], seed: int, kw: dict, bound: float = TIE_BOUND
) -> bool:
    """got == want, or they first differ where the two tokens' log p + g are within
    ``bound`` (then True: a near-tie)."""
    if got == want:
        return False
    j = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert j is not None, f"one is a prefix of the other: {got} / {want}"
    gap = perturbed_gap(base, prompt + want[:j], got[j], want[j], seed, kw)
    assert gap < bound, f"seed {seed}: differs at token {j} ({got[j]} vs {want[j]}), log p + g {gap:.3g} apart"
    return True
