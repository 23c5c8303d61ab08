"""One sequence's acceptance per draft position, as the adaptive draft length
estimates it (``_draft_policy`` chooses lengths from it and the cost model), and
the tokens a draft of each length yields on average under it."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Acceptance", "expected_gains", "expected_tokens"]

PRIOR_ACCEPTANCE = 0.6  # c_1 before anything was observed on this pair
PRIOR_WEIGHT = 2.0  # pseudo-observations of a position's prior
DECAY = 0.9  # a sequence's estimate: weight of the past per observation (about the last 10 steps)


def expected_tokens(c: Sequence[float], k: int) -> float:
    """Tokens a step drafting ``k`` yields on average: 1 + sum_{j<=k} prod_{i<=j} c_i."""
    e, p = 1.0, 1.0
    for i in range(k):
        p *= c[i]
        e += p
    return e


def expected_gains(c: Sequence[float], k_max: int) -> list[float]:
    """E(0..k_max). Of the chances that a confidence cut lets each position in (where it
    let the one before), the same sums are the target rows a step verifies on average."""
    out, e, p = [1.0], 1.0, 1.0
    for i in range(k_max):
        p *= c[i]
        e += p
        out.append(e)
    return out


class Acceptance:
    """One sequence's conditional acceptance per draft position (see ``_draft_policy``'s
    docstring). ``prior``: another estimate (the pair's), whose estimate of each
    position as it is now is that position's prior; or a number, the first
    position's prior, each later position's being the estimate of the one before."""

    def __init__(self, n: int, prior: float | Acceptance = PRIOR_ACCEPTANCE, decay: float = DECAY):
        self.n = n
        self.prior = prior
        self.decay = decay
        self._hit = [0.0] * n  # exponentially weighted kept / tried, per position
        self._try = [0.0] * n

    def observe(self, n_drafted: int, n_accepted: int, weight: float = 1.0) -> None:
        """A step that drafted ``n_drafted`` and kept ``n_accepted`` of them: positions
        1..n_accepted were kept, the next one rejected, the rest not tried. It counts
        as ``weight`` steps."""
        d = self.decay
        tried = min(n_drafted, n_accepted + 1, self.n)
        for i in range(tried):
            self._hit[i] = self._hit[i] * d + (weight if i < n_accepted else 0.0)
            self._try[i] = self._try[i] * d + weight
        # the positions not tried weigh less, their prior more (as while off): an estimate
        # of a position no short draft reaches would otherwise stay as it was for good, and
        # a low one would keep every draft short (the pair's too: nothing would try it)
        for i in range(tried, self.n):
            self._hit[i] *= d
            self._try[i] *= d

    def forget(self, steps: int = 1) -> None:
        """Steps without news (not drafted): what was seen weighs less, the prior more."""
        d = self.decay**steps
        self._hit = [h * d for h in self._hit]
        self._try = [t * d for t in self._try]

    def conditional(self, pooled: Sequence[float] | None = None, along: bool = True) -> list[float]:
        """c_1..c_n: each position's weighted rate shrunk toward its prior (an untried
        position: its prior). ``pooled``: the prior's conditional(), where the caller has
        it (a joint choice over many sequences computes it once).

        With the pair's estimate as the prior and ``along``, where this sequence's
        estimate of a position past the first falls below the pair's, the priors of the
        positions after it are scaled down by the same share: a sequence reaches the
        later positions of a block rarely, and the pair's estimate of them comes from
        the sequences that do, whose drafts keep most (replayed with
        ``benchmarks/policy_sim.py`` on the bench's recorded prompts at the padded pair's
        costs, the scaling made the adaptive engine 0.6-2.3% faster by workload). The
        first position's rejections do not scale them: they say nothing of the
        positions after it (a generation's first steps keep least).
        Without ``along`` the estimate bounds the one with it from above, and steps
        without news (``forget``) only move it toward the pair's."""
        out: list[float] = []
        if not isinstance(self.prior, (int, float)):  # each position's prior: the pair's estimate of it
            if pooled is None:
                pooled = self.prior.conditional()
            scale = 1.0
            for i in range(self.n):
                c = (self._hit[i] + PRIOR_WEIGHT * pooled[i] * scale) / (self._try[i] + PRIOR_WEIGHT)
                out.append(c)
                if along and i > 0 and pooled[i] > 0:
                    scale = min(c / pooled[i], 1.0)
            return out
        prior = self.prior
        for i in range(self.n):
            c = (self._hit[i] + PRIOR_WEIGHT * prior) / (self._try[i] + PRIOR_WEIGHT)
            out.append(c)
            # the next position's prior: this estimate where higher than the first's prior (a
            # low one chained along would keep drafts short, and nothing would try further)
            prior = max(c, self.prior)
        return out

    def first(self) -> float:
        """c_1 alone."""
        prior = self.prior if isinstance(self.prior, (int, float)) else self.prior.first()
        return (self._hit[0] + PRIOR_WEIGHT * prior) / (self._try[0] + PRIOR_WEIGHT) if self.n else prior
