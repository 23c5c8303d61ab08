"""verify="coupled": seeded sampling whose tokens are the target alone's (issue #52).

Every position i and token x get Gumbel noise g(seed, i, x) from a counter-based
generator (Philox4x32-10 keyed by the seed, counter (x, i)); the target's token is
argmax_x(log p_i(x) + g), an exact sample of p_i, and a drafter proposes
argmax_x(log q_i(x) + g) with the same noise. So the output for a seed is a
function of the target alone, whatever drafted it, at any draft length.

Checked here on tiny models (the shipped pair: test_coupled_embedded.py):
* the generator reproduces Philox's published known answers, and its noise is
  standard Gumbel, keyed by seed, position and token;
* the target alone's coupled tokens equal an independent replay (full-prefix
  ``score`` rows through the numpy reference of the sampler chain, plus the noise);
* every drafter kind (DFlash, DFlash2, DSpark, MTP, n-gram, external drafts)
  gives the target alone's tokens, at every draft length, and accepts some drafts;
* the first 4 positions follow the target's distribution (test_block_sampling's
  chi-square check), and a seeded coupled generation keeps the adaptive length.

Apart from near-ties: a verification pass rounds a logit differently from a
one-token decode (README), so where two tokens' log p + g lie within that
rounding either may come out; a divergence is accepted only at such a measured
near-tie of the full-prefix reference.
"""

from __future__ import annotations

import numpy as np
import pytest

from pydflash import Llama, _core, gguf_writers
from pydflash.gguf_writers.mtp import write_mtp_target
from support import blocks, mtp
from support.coupled import assert_same_or_near_tie
from support.ngram import SMALL
from support.sampling import transform

scipy_stats = pytest.importorskip("scipy.stats")

# (counter, key, output) from the Random123 distribution's kat_vectors
PHILOX_KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]
T1 = 1  # n_threads: tiny models, a shared machine
SAMPLING = dict(temperature=0.8, top_k=40)
SEEDS = (3, 1234, 2**40 + 7)
N_TOKENS = 32


def test_philox_reproduces_the_published_known_answers():
    for ctr, key, out in PHILOX_KAT:
        assert list(_core.philox4x32(ctr, key)) == out


def test_noise_is_standard_gumbel_keyed_by_seed_position_and_token():
    toks = list(range(2000))
    a = np.array(_core.coupled_gumbel(7, 10, toks))
    assert a.tolist() == _core.coupled_gumbel(7, 10, toks)  # a pure function
    assert scipy_stats.kstest(a, "gumbel_r").pvalue > 1e-4
    # another seed, position or token shift: independent draws (no correlation)
    for other in (_core.coupled_gumbel(8, 10, toks), _core.coupled_gumbel(7, 11, toks),
                  _core.coupled_gumbel(7, 10, [t + 1 for t in toks]), _core.coupled_gumbel(7 + 2**32, 10, toks)):
        b = np.array(other)
        assert scipy_stats.kstest(b, "gumbel_r").pvalue > 1e-4
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.1
    # the same value whatever else is asked with it
    assert _core.coupled_gumbel(7, 10, [5])[0] == a[5]


def coupled_replay(base: Llama, prompt: list[int], n: int, seed: int, kw: dict) -> tuple[list[int], list[float]]:
    """The coupled tokens from full-prefix scoring (independent of the engine's loop),
    and at each position the gap between the two best of log p + g."""
    ctx, out, gaps = list(prompt), [], []
    for _ in range(n):
        p = transform(base.pair.score(ctx)[-1], ctx[-blocks.WINDOW :], **kw)  # the penalties' window
        support = np.flatnonzero(p > 0)
        keys = np.log(p[support]) + np.array(_core.coupled_gumbel(seed, len(ctx), support.tolist()))
        order = np.argsort(-keys)
        out.append(int(support[order[0]]))
        gaps.append(float(keys[order[0]] - keys[order[1]]) if len(order) > 1 else np.inf)
        ctx.append(out[-1])
    return out, gaps


# ---------------------------------------------------------- DFlash on tiny models

# test_block_sampling's target with a flatter head: at T = 0.8 its next-token entropy
# is ~1.2 nats, and its drafter (blocks.DRAFTERS["qwen3-b8"]) proposes nearly its p
TARGET = gguf_writers.TargetSpec(head_scale=0.5, hot_tokens=24, seed=5, embd_common=6.0)
PROMPTS = [[17, 42, 99, 250, 5], [7], [300, 12, 99, 250, 17, 45], [65, 66, 67, 68, 69, 70]]


@pytest.fixture(scope="module")
def pair_paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("coupled")
    t = gguf_writers.write_target(d / "target.gguf", TARGET)
    return t, gguf_writers.write_drafter(d / "drafter.gguf", TARGET, blocks.DRAFTERS["qwen3-b8"][1])


@pytest.fixture(scope="module")
def alone(pair_paths):
    """The target alone's coupled tokens per (prompt, seed), and the Llama that made them."""
    with Llama(pair_paths[0], n_ctx=512, n_threads=T1) as base:
        out = {(i, s): base.generate(p, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                                     cache_prompt=False, **SAMPLING).tokens
               for i, p in enumerate(PROMPTS) for s in SEEDS}
        yield base, out


def test_the_target_alone_is_the_gumbel_max_of_its_own_rows(alone):
    base, out = alone
    n_ties = 0
    for (i, s), tokens in list(out.items())[:6]:
        ref, _ = coupled_replay(base, PROMPTS[i], N_TOKENS, s, SAMPLING)
        n_ties += assert_same_or_near_tie(base, PROMPTS[i], tokens, ref, s, SAMPLING)
    assert n_ties <= 1
    # and it is a sample, not a fixed path: seeds give different outputs
    assert len({tuple(out[0, s]) for s in SEEDS}) == len(SEEDS)


def test_a_coupled_target_alone_ignores_its_random_stream(alone):
    # the noise is keyed by position only: the same seed gives the same tokens again,
    # whatever the sampler drew before, and with the prompt cache on
    base, out = alone
    for s in SEEDS:
        base.generate(PROMPTS[1], max_tokens=5, temperature=1.0, seed=s + 1)  # another stream in between
        assert base.generate(PROMPTS[0], max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                             **SAMPLING).tokens == out[0, s]


@pytest.mark.parametrize("draft_max", [None, 1, 3, 7])
def test_dflash_gives_the_target_alone_tokens_at_every_length(pair_paths, alone, draft_max):
    base, out = alone
    drafted = accepted = ties = 0
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=512, n_threads=T1) as llm:
        for (i, s), want in out.items():
            res = llm.generate(PROMPTS[i], max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                               draft_max=draft_max, **SAMPLING)
            ties += assert_same_or_near_tie(base, PROMPTS[i], res.tokens, want, s, SAMPLING)
            drafted += res.stats.n_drafted
            accepted += res.stats.n_accepted
    assert ties <= 1
    if draft_max is not None:  # pinned: drafts every step, some kept and some not
        assert 0 < accepted < drafted


def test_several_sequences_with_other_requests_give_the_target_alone_tokens(pair_paths, alone):
    # coupled requests batched with rejection, match and greedy ones, prompt cache on and off
    base, out = alone
    keys = list(out)
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=4 * 256, n_parallel=4, n_threads=T1, draft_max=5) as llm:
        for cache in (True, False):
            gens = []
            for j, (i, s) in enumerate(keys):
                gens.append(llm.submit(PROMPTS[i], max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                                       cache_prompt=cache, **SAMPLING))
                other = ({"verify": "rejection", "temperature": 1.0}, {"verify": "match", "temperature": 0.5},
                         {"temperature": 0.0})[j % 3]
                llm.submit(PROMPTS[(i + 1) % len(PROMPTS)], max_tokens=N_TOKENS // 2 + j, seed=s, ignore_eos=True,
                           cache_prompt=cache, **other)
            ties = 0
            for (i, s), g in zip(keys, gens, strict=True):
                res = g.result()
                assert max(st.n_batch_seqs for st in res.stats.steps) > 1  # really batched
                ties += assert_same_or_near_tie(base, PROMPTS[i], res.tokens, out[i, s], s, SAMPLING)
            assert ties <= 1


# How far apart the two best of log p + g may be and still come out either way on some x86-64
# CPU: the KV cache is f16 and ggml's CPU flash attention rounds Q to f16, so between a 4-row
# verification and a 1-row decode a logit may move by one f16 step of its size (2^-11 relative);
# this model's logits stay under 10 in size, so two tokens' difference moves by up to ~1e-2,
# ~1.2e-2 at T = 0.8. The gaps measured on the target alone's paths below it are the near-ties
# a CPU's float order may decide (3 of the 256 positions below, on an AMD EPYC with AVX-512).
ROUNDING = 1e-2


@pytest.mark.parametrize("chain", [
    dict(repeat_penalty=1.3, presence_penalty=0.2, frequency_penalty=0.1),
    dict(top_p=0.9, min_p=0.05, logit_bias={281: -2.0, 57: 1.0}),
    dict(top_n_sigma=1.5, typical_p=0.9),
], ids=["penalties", "top-p-min-p-bias", "top-n-sigma-typical"])
def test_the_whole_sampler_chain_shapes_p_and_q(pair_paths, alone, chain):
    base, _ = alone
    kw = {**SAMPLING, **chain}
    sites: set[tuple[int, int, int]] = set()  # (prompt, seed, position) of the target's path where one differs
    close = accepted = 0
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=512, n_threads=T1) as llm:
        for i, p in enumerate(PROMPTS):
            for s in SEEDS[:2]:
                want = base.generate(p, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled", **kw).tokens
                res = llm.generate(p, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled", draft_max=3,
                                   **kw)
                accepted += res.stats.n_accepted
                # the target's p as llama.cpp's chain makes it (the numpy reference), and its gaps
                ref, gaps = coupled_replay(base, p, N_TOKENS, s, kw)
                close += sum(g < ROUNDING for g in gaps)
                for got in (res.tokens, ref):
                    if assert_same_or_near_tie(base, p, got, want, s, kw):
                        sites.add((i, s, next(j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)))
    # both comparisons run along the same path of the target alone, so a near-tie on it may show
    # in both: count where the near-ties are, not how often they are met. Only rounding-level
    # gaps (ROUNDING) are left to a CPU's float order; at least one may come out either way
    assert len(sites) <= max(1, close) and accepted > 0


def test_a_seeded_coupled_generation_keeps_the_adaptive_length(pair_paths):
    # other seeded samples pin the block length (their draws follow it); coupled
    # does not draw, so the engine still chooses each step's length
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=512, n_threads=T1) as llm:
        kw = dict(max_tokens=48, seed=5, ignore_eos=True, **SAMPLING)
        pinned = [st.draft_max for st in llm.generate(PROMPTS[0], verify="rejection", **kw).stats.steps]
        assert set(pinned[:-1]) == {llm.pair.max_draft}
        chosen = [st.draft_max for st in llm.generate(PROMPTS[0], verify="coupled", **kw).stats.steps]
        assert set(chosen[:-1]) != {llm.pair.max_draft}, chosen


def test_a_seeded_request_is_coupled_by_default(pair_paths, alone):
    # the default verify: "coupled" with a seed (per call or the Llama's), "rejection" without
    _, out = alone
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=512, n_threads=T1, draft_max=3) as llm:
        for s in SEEDS:
            assert llm.generate(PROMPTS[0], max_tokens=N_TOKENS, seed=s, ignore_eos=True,
                                **SAMPLING).tokens == out[0, s]
            # the rejection rule's text, unlike the default's, follows the drafts
            assert llm.generate(PROMPTS[0], max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="rejection",
                                **SAMPLING).tokens != out[0, s]
    with Llama(pair_paths[0], draft=pair_paths[1], n_ctx=512, n_threads=T1, draft_max=3, seed=SEEDS[1]) as llm:
        assert llm.generate(PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True, **SAMPLING).tokens == out[0, SEEDS[1]]


def test_the_first_four_positions_follow_the_target_distribution(block_models):
    # test_block_sampling's check (exact conditionals, chi-square, Bonferroni) on
    # 600 seeds of 4 tokens, drafted as one block of 3 and verified coupled
    llm = blocks.open_llm(block_models, "qwen3-b8")
    seqs, reach = blocks.sample_blocks(llm, blocks.N, 3, {**blocks.PLAIN, "draft_max": 3}, "coupled")
    pvals = blocks.target_pvalues(blocks.open_llm(block_models, "qwen3-b8", draft=False), seqs, blocks.PLAIN)
    print(f"\ncoupled: reach {np.round(reach, 3).tolist()}; min p-value {min(pvals):.3g}")
    assert blocks.passes(pvals), np.round(pvals, 6).tolist()
    assert reach[3] > 0.05 and reach[1] < 0.99, reach  # whole drafts kept, and rejections


def test_a_biased_coupled_sampler_is_detected(block_models):
    # the same check's power here: coupled at temperature 1.15 fails it against 1.0
    llm = blocks.open_llm(block_models, "qwen3-b8")
    seqs, _ = blocks.sample_blocks(llm, blocks.N, 3, dict(temperature=1.15), "coupled")
    base = blocks.open_llm(block_models, "qwen3-b8", draft=False)
    assert not blocks.passes(blocks.target_pvalues(base, seqs, blocks.PLAIN))


# ------------------------------------------------ the other drafters: one-hot drafts

KIND_TARGET = gguf_writers.TargetSpec(head_scale=2.0, hot_tokens=24, seed=5, embd_common=2.0)  # test_drafter_kinds
KIND_PROMPTS = ["def main(argv=None):", "The quick brown fox"]


@pytest.mark.parametrize("kind", ["dflash2", "dspark"])
def test_dflash2_and_dspark_give_the_target_alone_tokens(tmp_path, kind):
    v = gguf_writers.DrafterVariant(kind)
    spec = gguf_writers.DrafterSpec(seed=9, attn_out_scale=2.0, variant=v)
    t, d = gguf_writers.write_pair(tmp_path, KIND_TARGET, spec)
    check_kind(t, {"draft": d}, draft_maxes=(None, 2, 5))


def test_ngram_drafts_give_the_target_alone_tokens(pair_paths):
    # this target's samples repeat themselves: the n-gram drafter finds drafts, DFlash the rest
    opts = {"draft": pair_paths[1], "speculative": ["ngram-mod", "draft-dflash"], "ngram": SMALL}
    check_kind(pair_paths[0], opts, prompts=PROMPTS, draft_maxes=(3,), sources={"ngram-mod", "draft-dflash"})


def test_mtp_drafts_give_the_target_alone_tokens(tmp_path):
    path = write_mtp_target(tmp_path / "mtp.gguf", mtp.SPEC, mtp.HEAD)
    check_kind(path, {"speculative": ["draft-mtp"]}, draft_maxes=(1, 3), sources={"draft-mtp"})


def check_kind(target, opts: dict, *, prompts=KIND_PROMPTS, draft_maxes=(None,), sources=None) -> None:
    drafted = accepted = ties = 0
    seen: set[str] = set()
    with Llama(target, n_ctx=512, n_threads=T1) as base, Llama(target, n_ctx=512, n_threads=T1, **opts) as llm:
        for p in prompts:
            ids = base.prompt_tokens(p)
            for s in SEEDS[:2]:
                want = base.generate(ids, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                                     **SAMPLING).tokens
                for dm in draft_maxes:
                    res = llm.generate(ids, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                                       draft_max=dm, **SAMPLING)
                    ties += assert_same_or_near_tie(base, ids, res.tokens, want, s, SAMPLING)
                    drafted += res.stats.n_drafted
                    accepted += res.stats.n_accepted
                    seen |= {st.source for st in res.stats.steps if st.n_drafted}
    assert ties <= 1
    assert 0 < accepted < drafted
    if sources is not None:
        assert sources <= seen, seen


def test_external_drafts_are_kept_when_they_equal_the_target_token(pair_paths, alone):
    # a deterministic draft is kept exactly when it is the coupled token: the true
    # continuation is kept whole, a wrong token ends the step with the target's own
    base, out = alone
    want = out[0, SEEDS[0]]
    pair = base.pair
    pair.set_sampling(verify="coupled", seed=SEEDS[0], **SAMPLING)
    pair.prefill(PROMPTS[0])
    r = pair.step(draft=want[:5])
    assert r.tokens == want[:6] and r.n_accepted == 5
    wrong = (want[6] + 1) % base.n_vocab()
    r = pair.step(draft=[wrong, *want[7:9]])
    assert r.tokens == [want[6]] and r.n_accepted == 0
    r = pair.step(draft=want[7:12])
    assert r.tokens == want[7:13]
    pair.set_sampling()
