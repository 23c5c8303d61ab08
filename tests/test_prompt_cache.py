"""The prompt cache: a prefill with ``reuse`` keeps the prefix both caches
already hold (the target's K/V and the drafter's injected features are per
position) and evaluates only the rest. What follows must be exactly what a
prefill from empty caches gives, for every rollback kind.

Property tests: random histories (a generation of random length after a
random prompt), then random next prompts that share a random prefix with that
history, are diverge-anywhere edits or extend it (a conversation's next turn).
"""

from __future__ import annotations

import random

import pytest

from pydflash import Llama
from support.pairs import PAIRS, open_pair

N_CASES = 12
N_OUT = 24


def greedy_after(pair, prompt: list[int], *, reuse: bool, n: int = N_OUT) -> tuple[list, int]:
    """The next n tokens and each step's accepted count (equal only while the
    drafter's cache is in sync with the target's), and n_cached."""
    pair.prefill(prompt, reuse=reuse)
    cached = pair.n_cached
    out: list[int] = []
    accepted: list[int] = []
    while len(out) < n:
        step = pair.step()
        out += step.tokens
        accepted.append(step.n_accepted)
    return [out[:n], accepted], cached


def history_then(pair, rng: random.Random, n_vocab: int) -> list[int]:
    """Leaves a random history in the pair; returns the tokens it holds."""
    prompt = [rng.randrange(n_vocab) for _ in range(rng.randint(2, 40))]
    pair.prefill(prompt)
    for _ in range(rng.randint(0, 6)):
        pair.step()
    return pair.tokens  # history + the pending token


def next_prompt(rng: random.Random, held: list[int], n_vocab: int) -> tuple[list[int], str]:
    kind = rng.choice(["prefix-edit", "extend", "shorter", "same"])
    if kind == "extend":  # a conversation's next turn: all of it, then new tokens
        return held + [rng.randrange(n_vocab) for _ in range(rng.randint(1, 20))], kind
    if kind == "shorter":
        return held[: rng.randint(1, len(held))], kind
    if kind == "same":
        return list(held), kind
    cut = rng.randrange(len(held))
    return held[:cut] + [rng.randrange(n_vocab) for _ in range(rng.randint(1, 20))], kind


def check_cases(llm: Llama, seed: int, recurrent: bool) -> dict[str, int]:
    rng = random.Random(seed)
    pair, n_vocab = llm.pair, llm.n_vocab()
    seen: dict[str, int] = {}
    for _ in range(N_CASES):
        held = history_then(pair, rng, n_vocab)
        n_past = pair.n_past
        prompt, kind = next_prompt(rng, held, n_vocab)
        got, cached = greedy_after(pair, prompt, reuse=True)
        want, fresh_cached = greedy_after(pair, prompt, reuse=False)
        assert fresh_cached == 0
        assert got == want, (kind, prompt)
        common = 0
        while common < min(n_past, len(prompt) - 1) and held[common] == prompt[common]:
            common += 1
        if recurrent and common < n_past:
            common = 0  # a recurrent state is kept whole or not at all
        assert cached == common, (kind, cached, common, n_past)
        seen[kind] = seen.get(kind, 0) + (cached > 0)
    return seen


@pytest.mark.parametrize("seed", [1, 2])
def test_reuse_equals_a_fresh_prefill(dflash, seed):
    seen = check_cases(dflash, seed, recurrent=False)
    assert sum(seen.values()) > 0  # the cache was actually used


def test_reuse_on_the_target_alone(baseline):
    assert sum(check_cases(baseline, 3, recurrent=False).values()) > 0


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_reuse_on_hybrid_targets(hybrid_models, name):
    with open_pair(hybrid_models, name) as llm:
        seen = check_cases(llm, 4, recurrent=True)
    assert seen.get("extend", 0) + seen.get("same", 0) > 0  # next turns kept the state


def test_a_next_turn_takes_the_history_from_the_cache(dflash_b8):
    pair = dflash_b8.pair
    prompt = dflash_b8.tokenize("def fibonacci(n):")
    pair.prefill(prompt)
    for _ in range(3):
        pair.step()
    held = pair.tokens
    n_past = pair.n_past
    pair.prefill(held + dflash_b8.tokenize("\n\nprint(", add_bos=False, special=True), reuse=True)
    assert pair.n_cached == n_past == len(held) - 1  # everything but the pending token


def test_reset_and_score_empty_the_cache(dflash_b8):
    pair = dflash_b8.pair
    prompt = dflash_b8.tokenize("import os\nimport sys\n")
    pair.prefill(prompt)
    pair.reset()
    pair.prefill(prompt, reuse=True)
    assert pair.n_cached == 0
    pair.score(prompt)
    pair.prefill(prompt, reuse=True)
    assert pair.n_cached == 0
    pair.prefill(prompt, reuse=True)
    assert pair.n_cached == len(prompt) - 1


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("back", [1, 2, 5])
def test_a_recurrent_state_is_not_cut_back(hybrid_models, name, back):
    # a prompt that leaves the history `back` tokens before its end: the
    # recurrent state is kept only whole (a next turn), never cut back, so
    # this prefills from scratch and continues exactly as a fresh prefill
    with open_pair(hybrid_models, name) as llm:
        pair = llm.pair
        pair.prefill(llm.tokenize("def main(argv=None):"))
        for _ in range(4):
            pair.step()
        held = pair.tokens
        prompt = held[: pair.n_past - back] + [(held[pair.n_past - back] + 1) % llm.n_vocab()]
        got, cached = greedy_after(pair, prompt, reuse=True)
        assert cached == 0
        assert got == greedy_after(pair, prompt, reuse=False)[0]


# -- through Llama: generate()/stream() and the completions reuse the cache by default


def test_generate_reuses_the_cache_by_default(dflash_b8, baseline):
    prompt = dflash_b8.tokenize("class Stack:\n    def __init__(self):")
    first = dflash_b8.generate(prompt, max_tokens=24, ignore_eos=True, cache_prompt=False)
    assert first.stats.cached_tokens == 0
    turn2 = prompt + first.tokens + dflash_b8.tokenize("\n    def push(self, x):", add_bos=False, special=True)
    # accepted counts are compared: fixed draft lengths
    fresh = dflash_b8.generate(turn2, max_tokens=24, ignore_eos=True, cache_prompt=False, draft_max=7)
    dflash_b8.generate(prompt, max_tokens=24, ignore_eos=True, cache_prompt=False)  # turn 1 again
    cached = dflash_b8.generate(turn2, max_tokens=24, ignore_eos=True, draft_max=7)
    assert cached.stats.cached_tokens >= len(prompt) - 1 + len(first.tokens) - 1
    assert fresh.stats.cached_tokens == 0
    assert cached.tokens == fresh.tokens == baseline.generate(turn2, max_tokens=24, ignore_eos=True).tokens
    assert [s.n_accepted for s in cached.stats.steps] == [s.n_accepted for s in fresh.stats.steps]


def test_stream_and_completion_report_cache_n(dflash_b8):
    prompt = "def parse(text):\n    "
    dflash_b8.generate(prompt, max_tokens=4, cache_prompt=False)
    list(dflash_b8.stream(prompt, max_tokens=4))
    assert dflash_b8.pair.n_cached == len(dflash_b8.tokenize(prompt)) - 1
    res = dflash_b8.create_completion(prompt, max_tokens=4, temperature=0)
    t = res["timings"]
    assert t["cache_n"] == len(dflash_b8.tokenize(prompt)) - 1
    assert t["prompt_n"] + t["cache_n"] == res["usage"]["prompt_tokens"]
    res = dflash_b8.create_completion(prompt, max_tokens=4, temperature=0, cache_prompt=False)
    assert res["timings"]["cache_n"] == 0


def test_cache_prompt_must_be_a_bool(dflash_b8):
    with pytest.raises(TypeError, match="cache_prompt"):
        dflash_b8.generate("x", max_tokens=2, cache_prompt="yes")  # type: ignore[arg-type]
