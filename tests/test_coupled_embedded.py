"""verify="coupled" on the shipped trained pair (issue #52): for 20 prompts x 3 seeds
at T = 0.8, top-k 40, DFlash's tokens equal the target alone's, token for token,
with the adaptive length and lengths pinned to 1, 3 and 7, with the prompt cache
on and off, and under n_parallel=4 with other requests in the batch.

Apart from near-ties (README: a verification pass rounds logits differently from a
one-token decode): a divergence is accepted only where the two tokens' log p + g
lie within TIE_BOUND on the target's full-prefix row (support/coupled.py).
"""

from __future__ import annotations

import pytest

import pydflash
from pydflash import Llama
from support.coupled import assert_same_or_near_tie

SAMPLING = dict(temperature=0.8, top_k=40)
SEEDS = (11, 2024, 987654321)
N_TOKENS = 24
# the embedded pair's logits move by ~1e-3 between batchings (README); in units
# of log p + g at T = 0.8, with room
TIE_BOUND = 0.05
PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):\n    print(i)",
    "    if value is not None and index % 2 == 0:",
    "def read_config(path):\n    with open(path) as f:",
    "# Compute the mean of a list\ndef mean(xs):",
    "try:\n    import numpy as np\nexcept ImportError:",
    "return sorted(items, key=lambda",
    "while queue:\n    node = queue.pop(0)",
    "The quick brown fox",
    "Once upon a time, in a small village,",
    "Speculative decoding keeps the output of the target",
    "The capital of France is",
    "In this paper we propose",
    "She opened the door and",
    "The weather today is",
    "hello world " * 6,
    '{"key": [1, 2, 3], "other":',
    "Question: what is two plus two?\nAnswer:",
]


def generate(llm: Llama, prompt: str, seed: int, **kw):
    return llm.generate(prompt, max_tokens=N_TOKENS, seed=seed, ignore_eos=True, verify="coupled", **SAMPLING, **kw)


T1 = 1  # n_threads: on a shared machine a second llama.cpp worker mostly spins


@pytest.fixture(scope="module")
def embedded_target():
    with Llama(pydflash.embedded_pair()[0], n_ctx=1024, n_threads=T1) as llm:
        yield llm


@pytest.fixture(scope="module")
def embedded_dflash():
    target, drafter = pydflash.embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024, n_threads=T1) as llm:
        yield llm


@pytest.fixture(scope="module")
def reference(embedded_target):
    return {(p, s): generate(embedded_target, p, s, cache_prompt=False).tokens for p in PROMPTS for s in SEEDS}


def check(embedded_target, reference, results) -> None:
    """Each result equals the target alone's tokens, or first differs at a near-tie."""
    ties = 0
    for (p, s), tokens in results.items():
        ids = embedded_target.prompt_tokens(p)
        ties += assert_same_or_near_tie(embedded_target, ids, tokens, reference[p, s], s, SAMPLING, TIE_BOUND)
    print(f"\n{ties} near-ties in {len(results)} generations")
    assert ties <= 2


@pytest.mark.parametrize("cache_prompt", [True, False])
def test_adaptive_lengths_give_the_target_alone_tokens(embedded_dflash, embedded_target, reference, cache_prompt):
    results = {k: generate(embedded_dflash, *k, cache_prompt=cache_prompt).tokens for k in reference}
    check(embedded_target, reference, results)


@pytest.mark.parametrize("draft_max", [1, 3, 7])
def test_pinned_lengths_give_the_target_alone_tokens(embedded_dflash, embedded_target, reference, draft_max):
    results, drafted, accepted = {}, 0, 0
    for k in reference:
        res = generate(embedded_dflash, *k, draft_max=draft_max)
        results[k] = res.tokens
        drafted += res.stats.n_drafted
        accepted += res.stats.n_accepted
    check(embedded_target, reference, results)
    # on these short prompts the drafter is right for ~1 draft in 3 greedy, ~1 in 8 at T = 0.8
    assert 0.05 * drafted < accepted < drafted


def test_batched_with_other_requests_gives_the_target_alone_tokens(embedded_target, reference):
    target, drafter = pydflash.embedded_pair()
    others = ({"verify": "rejection", "temperature": 1.0}, {"verify": "match", "temperature": 0.5},
              {"temperature": 0.0})
    with Llama(target, draft=drafter, n_ctx=4 * 512, n_parallel=4, draft_max=3, n_threads=T1) as llm:
        for cache in (True, False):
            gens = {}
            for j, (p, s) in enumerate(reference):
                gens[p, s] = llm.submit(p, max_tokens=N_TOKENS, seed=s, ignore_eos=True, verify="coupled",
                                        cache_prompt=cache, **SAMPLING)
                llm.submit(PROMPTS[(j + 7) % len(PROMPTS)], max_tokens=N_TOKENS // 2 + j % 9, seed=s,
                           ignore_eos=True, cache_prompt=cache, **others[j % 3])
            results = {}
            for k, g in gens.items():
                res = g.result()
                results[k] = res.tokens
                assert max(st.n_batch_seqs for st in res.stats.steps) > 1  # really batched
            check(embedded_target, reference, results)


def test_a_json_schema_is_followed_and_coupled(embedded_dflash, embedded_target):
    # the grammar masks p and q alike; a divergence is checked on the unmasked row
    # (masking renormalises: two allowed tokens keep their log p difference)
    import json

    from support.json_schema import PROMPTS as JSON_PROMPTS
    from support.json_schema import SCHEMA

    kw = dict(temperature=0.9, max_tokens=120, json_schema=SCHEMA, verify="coupled")
    ties = 0
    for seed, prompt in enumerate(JSON_PROMPTS):
        want = embedded_target.generate(prompt, seed=seed, **kw)
        res = embedded_dflash.generate(prompt, seed=seed, draft_max=3, **kw)
        assert res.finish_reason == "eos" and isinstance(json.loads(res.text), dict), res.text
        ids = embedded_target.prompt_tokens(prompt)
        ties += assert_same_or_near_tie(embedded_target, ids, res.tokens, want.tokens, seed,
                                        dict(temperature=0.9), TIE_BOUND)
    assert ties <= 1
