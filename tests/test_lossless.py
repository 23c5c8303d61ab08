"""The invariant that matters most: at temperature 0, DFlash output equals the
target's own greedy output, token for token, for every draft length."""

from __future__ import annotations

import pytest

from pydflash import Llama, gguf_writers
from support.lossless import N_TOKENS, PROMPTS, TEXT_PROMPTS, check_stats


@pytest.fixture(scope="module")
def greedy_reference(baseline):
    cache: dict[str, list[int]] = {}

    def ref(prompt) -> list[int]:
        key = repr(prompt)
        if key not in cache:
            res = baseline.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True)
            assert len(res.tokens) == N_TOKENS
            cache[key] = res.tokens
        return cache[key]

    return ref


@pytest.mark.parametrize("prompt", PROMPTS)
def test_dflash_greedy_equals_target_greedy(dflash, greedy_reference, prompt):
    expected = greedy_reference(prompt)
    block = dflash.pair.block_size
    for draft_max in sorted(d for d in {1, 2, 4, 8, block - 1} if d < block):
        res = dflash.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=draft_max)
        assert res.tokens == expected, f"draft_max={draft_max} diverged"
        assert res.finish_reason == "length"
        check_stats(res, draft_max)


def test_fixed_default_draft_length_is_block_minus_one(dflash, greedy_reference):
    # the default adapts (test_adaptive_draft.py); draft_adaptive=False is the fixed one
    with Llama(dflash.model_path, draft=dflash.draft_path, n_ctx=1024, draft_adaptive=False) as llm:
        res = llm.generate(TEXT_PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True)
    assert res.tokens == greedy_reference(TEXT_PROMPTS[0])
    assert max(s.n_drafted for s in res.stats.steps) == dflash.pair.block_size - 1
    check_stats(res, dflash.pair.block_size - 1)


def test_some_drafts_are_accepted(dflash, greedy_reference):
    # the random drafter agrees with the target now and then: accepted paths run too
    # (whole blocks pinned: the adaptive length stops drafting for such a drafter)
    total = 0
    for prompt in TEXT_PROMPTS:
        res = dflash.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=dflash.pair.block_size - 1)
        total += res.stats.n_accepted
    assert total > 0


def test_plain_target_has_same_stats_shape(baseline):
    res = baseline.generate("def f():", max_tokens=20, ignore_eos=True)
    assert res.stats.n_steps == 20
    assert res.stats.n_drafted == 0 and res.stats.acceptance_rate == 0.0
    assert res.stats.mean_accepted_length == 1.0
    check_stats(res, 0)


def test_draft_max_zero_is_plain_decoding(dflash, greedy_reference):
    res = dflash.generate(TEXT_PROMPTS[1], max_tokens=40, ignore_eos=True, draft_max=0)
    assert res.tokens == greedy_reference(TEXT_PROMPTS[1])[:40]
    assert res.stats.n_drafted == 0 and res.stats.n_steps == 40


def test_max_tokens_cuts_last_step(dflash, greedy_reference):
    for n in (1, 2, 3, 5, 17):
        res = dflash.generate(TEXT_PROMPTS[2], max_tokens=n, ignore_eos=True)
        assert res.tokens == greedy_reference(TEXT_PROMPTS[2])[:n]
        assert res.finish_reason == "length"


def test_second_target_shape(tmp_path):
    # another target shape (more layers, wider) with its own drafter
    from pydflash import Llama

    spec = gguf_writers.TargetSpec(n_embd=96, n_layer=6, n_head=6, n_head_kv=3, head_dim=16, n_ff=192, seed=3)
    t = gguf_writers.write_target(tmp_path / "t.gguf", spec)
    d = gguf_writers.write_drafter(tmp_path / "d.gguf", spec,
                              gguf_writers.DrafterSpec(target_layers=(1, 3, 5), block_size=4, n_head=6, n_head_kv=3))
    with Llama(t, n_ctx=512) as base, Llama(t, draft=d, n_ctx=512) as spec_llm:
        for prompt in TEXT_PROMPTS[:6]:
            want = base.generate(prompt, max_tokens=64, ignore_eos=True).tokens
            for dm in (1, 2, 3):
                assert spec_llm.generate(prompt, max_tokens=64, ignore_eos=True, draft_max=dm).tokens == want
