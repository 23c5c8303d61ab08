"""An independent Python reference of one speculative step at temperature > 0, uniform
draw by uniform draw (tests/test_accept_resample.py's docstring explains the route).

The core's ``Sampler`` draws every uniform from ``std::mt19937_64`` seeded with the
sampling seed, as ``std::uniform_real_distribution<double>(0, 1)``: one 64-bit output
x gives u = x / 2^64 (``std::generate_canonical`` with a 64-bit engine, in libstdc++ and
libc++ alike). ``MT19937_64``
reimplements the engine from the C++ standard (and checks itself against the standard's
known answer); nothing here calls the core. The same stream serves, in order: the
drafter's samples of its block (one per drafted token), then per verified row the
accept draw, the residual's draw after a rejection, or the bonus token's draw. A
sample from a distribution with one token draws nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from support.sampling import transform

M64 = (1 << 64) - 1
# a draw this close to a decision's threshold may go either way: the core's probabilities are
# float32 (and p, as it reports it, a float32 log-probability: ~4e-7 of relative error)
AMBIGUOUS = 2e-6


class MT19937_64:
    """std::mt19937_64 (C++11 [rand.predef]), seeded as ``std::mt19937_64 rng(seed)``."""

    def __init__(self, seed: int) -> None:
        mt = [seed & M64]
        for i in range(1, 312):
            mt.append((6364136223846793005 * (mt[-1] ^ (mt[-1] >> 62)) + i) & M64)
        self.mt, self.i = mt, 312

    def _twist(self) -> None:
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
        self.i = 0

    def __call__(self) -> int:
        if self.i >= 312:
            self._twist()
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        return (y ^ (y >> 43)) & M64

    def uniform(self) -> float:
        return min(self() / 2.0**64, np.nextafter(1.0, 0.0))


# the C++ standard's check: the 10000th output of a default-constructed (seed 5489) engine
STANDARD_10000TH = 9981545732273789042


@dataclass
class Replay:
    """What the reference decided: the drafts, the emitted tokens, the accepted count,
    and the smallest distance of any draw from its decision threshold."""

    drafted: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    n_accepted: int = 0
    margin: float = 1.0


def _order(p: np.ndarray) -> np.ndarray:
    """p's support, most likely first (ties: lower id), the order the core walks."""
    order = np.lexsort((np.arange(len(p)), -p))
    return order[p[order] > 0]


def _walk(weights: np.ndarray, order: np.ndarray, u: float, out: Replay) -> int:
    """The first token of ``order`` whose cumulative weight (normalised) exceeds u."""
    cum = np.cumsum(weights[order]) / weights[order].sum()
    j = min(int(np.searchsorted(cum, u, side="right")), len(order) - 1)
    out.margin = min(out.margin, float(np.min(np.abs(cum[:-1] - u))) if len(cum) > 1 else 1.0)
    return int(order[j])


def sample(p: np.ndarray, rng: MT19937_64, out: Replay) -> int:
    order = _order(p)
    if len(order) == 1:
        return int(order[0])  # no draw
    return _walk(p, order, rng.uniform(), out)


def chain(row: np.ndarray, i: int, window: list[int], kw: dict, masks=None, bug: str | None = None) -> np.ndarray:
    """The sampler chain's distribution of generated position i's raw logits ``row``;
    ``masks``: under a grammar, the tokens it allows at the first generated position and
    at the later ones (the chain sees the others at -inf)."""
    if masks is None:
        return transform(row, window, **kw)
    allowed = masks[min(i, 1)]
    if bug == "mask-after-chain":  # the chain on the whole row, then the grammar's tokens kept
        p = transform(row, window, **kw) * allowed
        return p / p.sum() if p.sum() > 0 else allowed / allowed.sum()
    return transform(np.where(allowed, row, -np.inf), window, **kw)


def replay_step(rng: MT19937_64, rows: np.ndarray, recent: list[int], q_rows, drafted: list[int] | None,
                kw: dict, verify: str = "rejection", bug: str | None = None, masks=None,
                p_rows: list[np.ndarray] = ()) -> Replay:
    """One step, the first after a prefill. ``rows[i]``: the target's raw logits after the
    context and the first i drafts; ``recent``: the context's last tokens (the penalties'
    window, oldest first); ``q_rows(i)``: the drafter's raw logits row for block position
    i, unless ``drafted`` is given: an external (deterministic) draft, whose q is one-hot;
    ``masks``: a grammar's (``chain``). ``p_rows[i]``, where given, is p of row i as the
    core reported it (its rows' rounding differs from ``rows``' by up to ~1e-4 of
    probability); the others are the chain of ``rows[i]``. ``bug`` plants one mistake in
    the reference (the tests show each one is told apart)."""
    out = Replay()
    last_n = 64
    k = len(rows) - 1
    qs: list[np.ndarray] = []
    if drafted is None:  # the drafter samples its block from q, position by position
        drafted = []
        for i in range(k):
            q = chain(q_rows(i), i, (recent + drafted)[-last_n:], kw, masks, bug)
            qs.append(q)
            drafted.append(sample(q, rng, out))
    else:
        for x in drafted:
            qs.append(np.zeros(len(rows[0])))
            qs[-1][x] = 1.0
    out.drafted = list(drafted)
    for i in range(k + 1):
        p = p_rows[i] if i < len(p_rows) else chain(rows[i], i, (recent + drafted[:i])[-last_n:], kw, masks, bug)
        if i == k:  # every draft accepted: the target's own token
            out.tokens.append(sample(p, rng, out))
            break
        x = drafted[i]
        if verify == "match":  # the target's own sample must equal the draft
            t = sample(p, rng, out)
            out.tokens.append(t)
            if t != x:
                break
            out.n_accepted += 1
            continue
        q = qs[min(i + 1, k - 1)] if bug == "q-next-position" else qs[i]
        if q[x] > 0:
            u = rng.uniform()
            ratio = q[x] / p[x] if bug == "ratio-inverted" and p[x] > 0 else p[x] / q[x]
            threshold = min(1.0, ratio)
            if ratio < 1.0 + AMBIGUOUS:  # (above it, every u < 1 accepts)
                out.margin = min(out.margin, abs(u - threshold))
            if u < threshold:
                out.tokens.append(x)
                out.n_accepted += 1
                continue
        resid = p if bug == "resample-from-p" else np.maximum(0.0, p - q)
        if resid.sum() > 1e-12:
            out.tokens.append(_walk(resid, _order(p), rng.uniform(), out))
        else:  # p == q: any sample of p is exact
            out.tokens.append(sample(p, rng, out))
        break
    return out
