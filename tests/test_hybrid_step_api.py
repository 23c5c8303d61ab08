"""The step API on hybrid targets, with controlled acceptance through external
drafts: full acceptance, rejection at every position, long runs of partial
rejections, drafts longer than the state planes (checkpoint fallback)."""

from __future__ import annotations

import random

import pytest

from pydflash import Llama
from support.pairs import PAIRS, THREADS, open_pair

PROMPT = "def main(argv=None):"


def corrupt(token: int, n_vocab: int) -> int:
    return (token + 1) % n_vocab


@pytest.fixture(scope="module", params=sorted(PAIRS))
def case(request, hybrid_models):
    arch = PAIRS[request.param][0]
    with Llama(hybrid_models / f"{arch}-target.gguf", n_ctx=1024, n_threads=THREADS) as base:
        ref = base.generate(PROMPT, max_tokens=240, ignore_eos=True).tokens
    with open_pair(hybrid_models, request.param) as llm:
        yield llm, ref


def continue_greedy(pair, out: list[int], n: int) -> list[int]:
    while len(out) < n:
        out += pair.step().tokens
    return out[:n]


def test_full_acceptance(case):
    llm, ref = case
    pair = llm.pair
    k = pair.max_draft
    pair.prefill(llm.tokenize(PROMPT))
    n0 = pair.n_past
    step = pair.step(draft=ref[:k])
    assert step.n_drafted == k and step.n_accepted == k
    assert list(step.tokens) == ref[: k + 1]
    assert pair.n_past == n0 + k + 1
    assert continue_greedy(pair, list(step.tokens), 80) == ref[:80]


def test_rejection_at_each_position(case):
    llm, ref = case
    pair = llm.pair
    k = pair.max_draft
    for cut in range(k):
        pair.prefill(llm.tokenize(PROMPT))
        n0 = pair.n_past
        draft = list(ref[:k])
        draft[cut] = corrupt(draft[cut], llm.n_vocab())
        step = pair.step(draft=draft)
        assert step.n_accepted == cut
        assert list(step.tokens) == ref[: cut + 1]
        assert pair.n_past == n0 + cut + 1
        # the target (recurrent state + KV) and the drafter continue exactly as greedy
        assert continue_greedy(pair, list(step.tokens), 60) == ref[:60], f"diverged after a cut at {cut}"


def test_many_partial_rejections_in_a_row(case):
    llm, ref = case
    rng = random.Random(2)
    pair = llm.pair
    pair.prefill(llm.tokenize(PROMPT))
    out: list[int] = []
    cuts = []
    while len(out) < 200:
        n = rng.randint(1, pair.max_draft)
        draft = list(ref[len(out): len(out) + n])
        if len(draft) < n:
            break
        r = rng.random()  # reject at the first position, accept all, or a partial cut
        cut = 0 if r < 0.2 else n if r < 0.35 or n == 1 else rng.randint(1, n - 1)
        if cut < n:
            draft[cut] = corrupt(draft[cut], llm.n_vocab())
        step = pair.step(draft=draft)
        assert step.n_accepted == cut
        cuts.append((cut, n))
        out += step.tokens
        if rng.random() < 0.3:  # interleave the drafter's own steps
            out += pair.step().tokens
    assert out == ref[: len(out)]
    assert sum(1 for c, n in cuts if c == 0) >= 3           # rejected at the first position
    assert sum(1 for c, n in cuts if 0 < c < n) >= 10       # partial
    assert sum(1 for c, n in cuts if c == n) >= 3           # everything accepted


def test_drafts_longer_than_the_planes(case):
    # an external draft longer than n_rs_seq needs a checkpoint even with planes
    llm, ref = case
    pair = llm.pair
    k = pair.max_draft + 9
    for cut in (0, 5, pair.max_draft + 3, k):
        pair.prefill(llm.tokenize(PROMPT))
        draft = list(ref[:k])
        if cut < k:
            draft[cut] = corrupt(draft[cut], llm.n_vocab())
        step = pair.step(draft=draft)
        assert step.n_accepted == cut
        assert list(step.tokens) == ref[: cut + 1]
        assert continue_greedy(pair, list(step.tokens), 70) == ref[:70]


def test_long_draft_after_a_pending_plane_rollback(case):
    # a partial rejection leaves a plane rollback pending; the next step's
    # checkpoint must save the rolled-back state, not the newest plane
    llm, ref = case
    pair = llm.pair
    k = pair.max_draft
    for cut in (0, k // 2):
        pair.prefill(llm.tokenize(PROMPT))
        draft = list(ref[:k])
        draft[cut] = corrupt(draft[cut], llm.n_vocab())
        out = list(pair.step(draft=draft).tokens)
        assert out == ref[: cut + 1]
        long = list(ref[len(out): len(out) + k + 6])
        long[k + 2] = corrupt(long[k + 2], llm.n_vocab())
        step = pair.step(draft=long)
        assert step.n_accepted == k + 2
        out += step.tokens
        assert continue_greedy(pair, out, 70) == ref[:70]


def test_state_after_steps(case):
    llm, ref = case
    pair = llm.pair
    prompt = llm.tokenize(PROMPT)
    pair.prefill(prompt)
    out = continue_greedy(pair, [], 30)
    assert out == ref[:30]
    assert pair.tokens[: len(prompt)] == prompt
    assert pair.n_past == len(pair.tokens) - 1
    pair.reset()
    assert pair.n_past == 0 and pair.tokens == []
    # a fresh prefill after reset decodes the same again
    pair.prefill(prompt)
    assert continue_greedy(pair, [], 30) == ref[:30]


def test_plain_hybrid_pair_verifies_external_drafts(hybrid_models):
    """Without a drafter the target keeps no planes: an external draft is
    verified with a checkpoint of the recurrent state."""
    path = hybrid_models / "qwen35-target.gguf"
    with Llama(path, n_ctx=512, n_threads=THREADS) as llm:
        ref = llm.generate(PROMPT, max_tokens=120, ignore_eos=True).tokens
        pair = llm.pair
        assert pair.rollback == "checkpoint"
        pair.prefill(llm.tokenize(PROMPT))
        rng = random.Random(5)
        out: list[int] = []
        while len(out) < 100:
            n = rng.randint(1, 12)
            draft = list(ref[len(out): len(out) + n])
            cut = rng.randint(0, len(draft))
            if cut < len(draft):
                draft[cut] = corrupt(draft[cut], llm.n_vocab())
            step = pair.step(draft=draft)
            assert step.n_accepted == cut
            out += step.tokens
        assert out == ref[: len(out)]
