"""Sampling at temperature > 0 keeps the target's distribution exactly, in both
verification modes.

Each test draws N short generations with DFlash and compares the empirical
distribution of the first two generated tokens (the joint distribution and
both marginals) with the EXACT distribution of the target, computed from its
logits with llama.cpp's default sampler chain (penalties, top-k, top-p,
min-p, temperature last) re-implemented here in numpy, by chi-square
goodness-of-fit tests. Each of the three checks fails by chance with
probability ALPHA = 1e-4 when the sampler is exact, so a test's false-alarm
rate is at most 3e-4.

Their power is computed, not assumed (tools/sampling_test_power.py, from the
exact distributions; benchmarks/results/sampling-test-power.json): each setting
kept here fails a sampler at temperature x1.25 with probability >= 0.9 at its N
(support.sampling.N_OF raises N where that is needed), while a x1.10 error is
caught only by some settings and a x1.05 error by almost none. A setting without
that power at an affordable N (support.sampling.NO_POWER) is checked draw by
draw instead. These checks are not the gate for the accept/resample rule's
exactness: tests/test_accept_resample.py replays every decision of the rule, and
tests/test_block_sampling.py's rank checks cover whole blocks.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pydflash import Llama
from support.sampling import ALPHA, N, N_OF, PROMPT, SETTINGS, exact_joint, fit_pvalue


def sample_pairs(llm: Llama, n: int, **kw) -> tuple[dict, float]:
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(n):
        res = llm.generate(PROMPT, max_tokens=2, seed=seed, ignore_eos=True, **kw)
        key = (res.tokens[0], res.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += res.stats.n_drafted
        accepted += res.stats.n_accepted
    return counts, accepted / max(drafted, 1)


POWER = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "sampling-test-power.json"


def test_every_chi_square_setting_has_its_computed_power():
    # the settings and N here are those whose power was computed (tools/sampling_test_power.py
    # rewrites the file): a setting changed or added without it fails here
    table = json.loads(POWER.read_text())["test_sampling"]
    for name, kw in SETTINGS.items():
        row = table[name]
        recorded = {k: (dict((int(t), b) for t, b in v) if k == "logit_bias" else v) for k, v in row["sampling"].items()}
        assert recorded == kw and row["kept"] and row["n_used"] == N_OF.get(name, N), (name, row["sampling"])
        assert row["simulated_power_at_n_used"]["x1.25"] >= 0.9, (name, row["simulated_power_at_n_used"])


# settings whose few kept tokens this random drafter's q never hits: every draft is
# rejected and the residual path is what they test (external drafts, below, are accepted)
NARROW = {"T0.6-topk24-typical0.5"}


@pytest.mark.parametrize("verify", ["rejection", "match", "coupled"])
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_dflash_sampling_matches_target_distribution(spread_pair, verify, setting):
    llm, base = spread_pair
    kw = SETTINGS[setting]
    n = N_OF.get(setting, N)
    exact = exact_joint(base, PROMPT, 64, **kw)
    counts, acc = sample_pairs(llm, n, verify=verify, **kw)
    p = fit_pvalue(counts, exact, n)
    assert p > ALPHA, f"{verify}/{setting}: chi-square p={p:.2e}, acceptance {acc:.3f}"
    if verify == "rejection" and setting not in NARROW:
        # the drafter's samples must actually be exercised: accepted and rejected
        assert 0.02 < acc < 0.98, acc


@pytest.mark.parametrize("verify", ["rejection", "match", "coupled"])
@pytest.mark.parametrize("setting", ["T1-topk6", "T0.5-topp0.3-minp"])
def test_external_drafts_keep_the_distribution(spread_pair, verify, setting):
    # drafts from another source (here: the target's own greedy tokens, so that
    # they are often accepted) are verified exactly too; q is one-hot for them
    llm, base = spread_pair
    kw = SETTINGS[setting]
    greedy = base.generate(PROMPT, max_tokens=3, ignore_eos=True).tokens
    exact = exact_joint(base, PROMPT, 64, **kw)
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    pair = llm.pair
    for seed in range(N):
        pair.set_sampling(seed=seed, verify=verify, **kw)
        pair.prefill(PROMPT)
        step = pair.step(draft=greedy[:2])
        toks = list(step.tokens)
        while len(toks) < 2:
            toks += pair.step(0).tokens
        counts[(toks[0], toks[1])] = counts.get((toks[0], toks[1]), 0) + 1
        accepted += step.n_accepted
    assert fit_pvalue(counts, exact, N) > ALPHA
    assert 0.05 < accepted / (2 * N) < 0.95


def test_plain_sampling_matches_target_distribution(spread_pair):
    # the same check on the target alone validates the reference transform itself
    llm, base = spread_pair
    kw = SETTINGS["T1-topk6"]
    counts, _ = sample_pairs(base, N, **kw)
    assert fit_pvalue(counts, exact_joint(base, PROMPT, 64, **kw), N) > ALPHA


ORDER_SENSITIVE = SETTINGS["T0.5-topp0.3-minp"]


def test_the_order_is_llama_cpps_and_the_old_one_is_detected(spread_pair):
    # at temperature != 1, cutting before or after the temperature gives
    # different distributions: the target alone must fit llama.cpp's chain,
    # and the same samples must fail against the old order (power)
    llm, base = spread_pair
    counts, _ = sample_pairs(base, N, **ORDER_SENSITIVE)
    assert fit_pvalue(counts, exact_joint(base, PROMPT, 64, **ORDER_SENSITIVE), N) > ALPHA
    old = exact_joint(base, PROMPT, 64, old_order=True, **ORDER_SENSITIVE)
    outside = sum(c for k, c in counts.items() if k not in old)  # samples the old chain cannot produce
    assert outside > 0 or fit_pvalue(counts, old, N) < ALPHA


def test_the_bias_comes_before_the_penalties_and_the_other_order_is_detected(spread_pair):
    llm, base = spread_pair
    kw = SETTINGS["T1-bias-penalties"]
    new = exact_joint(base, PROMPT, 64, **kw)
    old = exact_joint(base, PROMPT, 64, old_bias_order=True, **kw)
    keys = set(new) | set(old)
    assert sum(abs(new.get(k, 0.0) - old.get(k, 0.0)) for k in keys) / 2 > 0.05  # the setting tells them apart
    counts, _ = sample_pairs(base, N, **kw)
    assert fit_pvalue(counts, new, N) > ALPHA
    outside = sum(c for k, c in counts.items() if k not in old)
    assert outside > 0 or fit_pvalue(counts, old, N) < ALPHA


def test_a_biased_sampler_is_detected(spread_pair):
    # power check: sampling at a slightly different temperature must fail the test
    llm, base = spread_pair
    counts, _ = sample_pairs(llm, N, temperature=1.25, top_k=6)
    assert fit_pvalue(counts, exact_joint(base, PROMPT, 64, temperature=1.0, top_k=6), N) < ALPHA


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_temperature_zero_is_greedy_in_both_modes(dflash, baseline, verify):
    want = baseline.generate("def f(x):", max_tokens=64, ignore_eos=True).tokens
    got = dflash.generate("def f(x):", max_tokens=64, ignore_eos=True, verify=verify)
    assert got.tokens == want


def test_greedy_with_penalties_and_bias_is_lossless(dflash, baseline):
    kw = dict(repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, logit_bias={7: 5.0, 8: -100.0})
    want = baseline.generate("import os", max_tokens=80, ignore_eos=True, **kw).tokens
    for dm in (1, 3, 7):
        assert dflash.generate("import os", max_tokens=80, ignore_eos=True, draft_max=dm, **kw).tokens == want
    assert 8 not in want


def test_seeded_sampling_is_reproducible(spread_pair):
    llm, _ = spread_pair
    for verify in ("rejection", "match", "coupled"):
        a = llm.generate(PROMPT, max_tokens=40, temperature=0.9, seed=7, verify=verify, ignore_eos=True)
        b = llm.generate(PROMPT, max_tokens=40, temperature=0.9, seed=7, verify=verify, ignore_eos=True)
        assert a.tokens == b.tokens


def test_draft_controls(dflash, baseline):
    want = baseline.generate("x = [", max_tokens=60, ignore_eos=True).tokens
    res = dflash.generate("x = [", max_tokens=60, ignore_eos=True, draft_min=100)
    assert res.tokens == want and res.stats.n_drafted == 0  # every block shorter than draft_min
    res = dflash.generate("x = [", max_tokens=60, ignore_eos=True, draft_min=3, draft_max=5)
    assert res.tokens == want
    made = 0
    for s in res.stats.steps:
        # blocks shorter than draft_min are dropped; what is kept is then cut to the
        # tokens left, as in llama.cpp (n_min applies before its budget cut)
        assert s.n_drafted in (0, 3, 4, 5) or s.n_drafted == 60 - made - 1, (made, s)
        made += len(s.tokens)


def test_draft_p_min_cuts_unconfident_blocks(spread_pair):
    # the spread drafter is never 90% sure of a token: every block is cut to nothing
    llm, base = spread_pair
    want = base.generate(PROMPT, max_tokens=40, ignore_eos=True).tokens
    full = llm.generate(PROMPT, max_tokens=40, ignore_eos=True, draft_max=llm.pair.max_draft)
    cut = llm.generate(PROMPT, max_tokens=40, ignore_eos=True, draft_p_min=0.9, draft_max=llm.pair.max_draft)
    assert full.tokens == cut.tokens == want
    assert full.stats.n_drafted > 0 and cut.stats.n_drafted == 0


@pytest.mark.parametrize("kw,match", [
    ({"verify": "maybe"}, "verify"),
    ({"min_p": 1.0}, "min_p"),
    ({"repeat_penalty": 0.0}, "repeat_penalty"),
    ({"draft_p_min": 1.5}, "draft_p_min"),
    ({"draft_min": -1}, "draft_min"),
    ({"logit_bias": {10**6: 1.0}}, "out of range"),
    ({"penalty_last_n": -1}, "penalty_last_n"),
    ({"typical_p": 0.0}, "typical_p"),
    ({"typical_p": 1.5}, "typical_p"),
    ({"top_n_sigma": float("nan")}, "top_n_sigma"),
])
def test_bad_sampling_options(dflash, kw, match):
    with pytest.raises(ValueError, match=match):
        dflash.generate("x", max_tokens=3, **kw)
    assert len(dflash.generate("x", max_tokens=3, ignore_eos=True).tokens) == 3
