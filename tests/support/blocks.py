"""The whole-block check of tests/test_block_sampling.py (its docstring explains it):
the first k + 1 tokens of N seeded generations against the target alone's exact
distributions (chi-square on the first positions, rank buckets with the exact
covariance on every position's conditional, Bonferroni over them), and the tiny
models it runs on. Also used by the coupled, MTP and drafter-kind tests."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash import Llama, gguf_writers
from support.models import SPREAD, SPREAD_DRAFTER
from support.sampling import transform

scipy_stats = pytest.importorskip("scipy.stats")

FAMILY_ALPHA = 1e-4
N = 600
PROMPT = [17, 42, 99, 250, 5]
WINDOW = 64  # penalty_last_n (the default)


def pooled_chi_square(counts: dict, probs: dict, n: int) -> float:
    """Goodness of fit; categories with expected count < 5 are pooled."""
    unexpected = sum(c for k, c in counts.items() if k not in probs)
    assert unexpected == 0, f"{unexpected} samples outside the target's support"
    obs, exp = [], []
    pool_o = pool_e = 0.0
    for k, p in probs.items():
        if p * n < 5:
            pool_o += counts.get(k, 0)
            pool_e += p * n
        else:
            obs.append(counts.get(k, 0))
            exp.append(p * n)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    if len(obs) < 2:
        return 1.0
    exp_arr = np.array(exp) * (n / sum(exp))
    return float(scipy_stats.chisquare(obs, exp_arr).pvalue)


def conditional_pvalue(tokens: np.ndarray, probs: np.ndarray) -> float:
    """tokens[i] was drawn from probs[i] (exact conditional, one row per
    sample)? Rank-bucket test with the exact covariance (module docstring)."""
    n = len(tokens)
    p_tok = probs[np.arange(n), tokens]
    assert np.all(p_tok > 0), f"{int(np.sum(p_tok <= 0))} samples outside the target's support"
    order = np.argsort(-probs, axis=1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=1)
    rank = np.argmax(order == tokens[:, None], axis=1)
    expected = sorted_p.sum(axis=0)
    n_buckets = 1
    while n_buckets < 8 and expected[n_buckets - 1] >= 5 and expected[n_buckets:].sum() >= 5:
        n_buckets += 1
    pi = np.zeros((n, n_buckets))
    pi[:, : n_buckets - 1] = sorted_p[:, : n_buckets - 1]
    pi[:, -1] = 1.0 - pi[:, : n_buckets - 1].sum(axis=1)
    obs = np.bincount(np.minimum(rank, n_buckets - 1), minlength=n_buckets).astype(float)
    d = obs - pi.sum(axis=0)
    cov = np.diag(pi.sum(axis=0)) - pi.T @ pi
    df = np.linalg.matrix_rank(cov, tol=1e-9 * max(1.0, float(np.abs(cov).max())))
    if df == 0:
        return 1.0
    stat = float(d @ np.linalg.pinv(cov, rcond=1e-9, hermitian=True) @ d)
    return float(scipy_stats.chi2.sf(stat, df))


def block_pvalues(seqs: np.ndarray, cond: np.ndarray, p0: np.ndarray, joint: dict) -> list[float]:
    """seqs (n, k+1) generated tokens; cond (n, k+1, V) the exact conditional
    of each position along each sample's prefix; p0 the exact first-token
    distribution; joint the exact P(t0, t1) (first tokens of expected count
    < 5 lumped into key (t0, -1)). Returns the m = k + 3 p-values."""
    n = len(seqs)
    c0: dict = {}
    cj: dict = {}
    for s in seqs:
        c0[int(s[0])] = c0.get(int(s[0]), 0) + 1
        key = (int(s[0]), int(s[1])) if (int(s[0]), -1) not in joint else (int(s[0]), -1)
        cj[key] = cj.get(key, 0) + 1
    pvals = [
        pooled_chi_square(c0, {int(t): float(p0[t]) for t in np.flatnonzero(p0 > 0)}, n),
        pooled_chi_square(cj, joint, n),
    ]
    pvals += [conditional_pvalue(seqs[:, j], cond[:, j]) for j in range(seqs.shape[1])]
    return pvals


def passes(pvals: list[float]) -> bool:
    return min(pvals) > FAMILY_ALPHA / len(pvals)


def exact_first_two(p0: np.ndarray, row1, n: int) -> dict:
    """P(t0, t1); first tokens with expected count < 5 keep only P(t0)."""
    joint = {}
    for t0 in np.flatnonzero(p0 > 0):
        if p0[t0] * n < 5:
            joint[(int(t0), -1)] = float(p0[t0])
            continue
        p1 = row1(int(t0))
        for t1 in np.flatnonzero(p1 > 0):
            joint[(int(t0), int(t1))] = float(p0[t0] * p1[t1])
    return joint


# embd_common: the next-token distribution moves only a little with the context,
# so these random drafters propose nearly the target's p (see the module docstring)
QWEN3 = gguf_writers.TargetSpec(head_scale=1.0, hot_tokens=24, seed=5, embd_common=6.0)
QWEN35 = gguf_writers.HybridSpec(head_scale=1.0, hot_tokens=24, seed=5, embd_common=10.0, ssm_out_scale=0.3)
DRAFTERS = {
    "qwen3-b8": (QWEN3, gguf_writers.DrafterSpec(seed=9, attn_out_scale=2.0)),
    "qwen3-b16": (
        QWEN3,
        gguf_writers.DrafterSpec(
            n_layer=2,
            n_head=2,
            n_head_kv=1,
            head_dim=32,
            n_ff=96,
            target_layers=(0, 2, 3),
            block_size=16,
            seed=7,
            attn_out_scale=0.1,
        ),
    ),
    "qwen35-b8": (
        QWEN35,
        gguf_writers.DrafterSpec(target_layers=(1, 3), rope_sections=QWEN35.rope_sections, seed=9, attn_out_scale=0.1),
    ),
}
# a random drafter far from the target (test_sampling's spread pair): its q differs
# from position to position, so a q taken from the wrong block position shows
DRAFTERS["spread-b8"] = (SPREAD, SPREAD_DRAFTER)
PLAIN = dict(temperature=1.0)
TOPK = dict(temperature=1.0, top_k=6)
PENALTIES = dict(temperature=1.0, repeat_penalty=1.1, presence_penalty=0.1, frequency_penalty=0.05)


def open_llm(block_models, name: str, draft: bool = True) -> Llama:
    paths, opened = block_models
    key = (name, draft)
    if key not in opened:
        t, d = paths[name]
        # one thread: on a shared 2-core machine llama.cpp's spinning workers cost 30x
        opened[key] = Llama(t, draft=d if draft else None, n_ctx=256, n_threads=1)
    return opened[key]


def sample_blocks(llm: Llama, n: int, k: int, kw: dict, verify: str | None) -> tuple[np.ndarray, np.ndarray]:
    """n generations of k + 1 tokens; returns them and the reach counts."""
    seqs = np.zeros((n, k + 1), dtype=np.int64)
    reach = np.zeros(k + 1)
    extra = {"verify": verify} if verify else {}
    for s in range(n):
        res = llm.generate(PROMPT, max_tokens=k + 1, seed=1000 + s, ignore_eos=True, **kw, **extra)
        seqs[s] = res.tokens
        if verify:
            reach[: res.stats.steps[0].n_accepted + 1] += 1
    return seqs, reach / n


def exact_rows(base: Llama, seqs: np.ndarray, kw: dict) -> np.ndarray:
    """cond[i, j]: the target's exact distribution of position j given PROMPT +
    seqs[i, :j], with the sampler chain applied (penalty window included)."""
    n, m = seqs.shape
    out = np.zeros((n, m, base.n_vocab()))
    for i, s in enumerate(seqs):
        ctx = PROMPT + [int(t) for t in s]
        logits = base.pair.score(ctx[:-1])[len(PROMPT) - 1 :]
        for j in range(m):
            out[i, j] = transform(logits[j], ctx[: len(PROMPT) + j][-WINDOW:], **kw)
    return out


def target_pvalues(base: Llama, seqs: np.ndarray, kw: dict) -> list[float]:
    n = len(seqs)
    cond = exact_rows(base, seqs, kw)
    p0 = transform(base.pair.score(PROMPT)[-1], PROMPT[-WINDOW:], **kw)

    def row1(t0: int) -> np.ndarray:
        ctx = [*PROMPT, t0]
        return transform(base.pair.score(ctx)[-1], ctx[-WINDOW:], **kw)

    return block_pvalues(seqs, cond, p0, exact_first_two(p0, row1, n))
