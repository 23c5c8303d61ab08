"""The low-level step API: controlled acceptance through external drafts
(full accept, reject at every position, long runs of partial rejections)."""

from __future__ import annotations

import random

import pytest

from pydflash import StepResult

PROMPT = "def main(argv=None):"


@pytest.fixture(scope="module")
def reference(baseline):
    return baseline.generate(PROMPT, max_tokens=200, ignore_eos=True).tokens


def corrupt(token: int, n_vocab: int) -> int:
    return (token + 1) % n_vocab


def test_full_acceptance(dflash_b8, reference):
    pair = dflash_b8.pair
    pair.prefill(dflash_b8.tokenize(PROMPT))
    n0 = pair.n_past
    step = pair.step(draft=reference[:7])
    assert isinstance(step, StepResult)
    assert step.n_drafted == 7 and step.n_accepted == 7
    assert list(step.tokens) == reference[:8]
    assert pair.n_past == n0 + 8
    assert "n_accepted=7" in repr(step)


@pytest.mark.parametrize("k", range(7))
def test_rejection_at_each_position(dflash_b8, reference, k):
    pair = dflash_b8.pair
    pair.prefill(dflash_b8.tokenize(PROMPT))
    n0 = pair.n_past
    draft = list(reference[:7])
    draft[k] = corrupt(draft[k], dflash_b8.n_vocab())
    step = pair.step(draft=draft)
    assert step.n_accepted == k
    assert list(step.tokens) == reference[: k + 1]
    assert pair.n_past == n0 + k + 1
    # decoding continues exactly as greedy after the rollback (target + drafter caches)
    out = list(step.tokens)
    while len(out) < 60:
        out += pair.step().tokens
    assert out[:60] == reference[:60]


def test_many_partial_rejections_in_a_row(dflash_b8, reference):
    rng = random.Random(1)
    pair = dflash_b8.pair
    pair.prefill(dflash_b8.tokenize(PROMPT))
    out: list[int] = []
    accepted = []
    while len(out) < 150:
        n = rng.randint(1, 7)
        draft = list(reference[len(out): len(out) + n])
        if len(draft) < n:
            break
        cut = rng.randint(0, n)  # n = accept all
        if cut < n:
            draft[cut] = corrupt(draft[cut], dflash_b8.n_vocab())
        step = pair.step(draft=draft)
        assert step.n_accepted == cut
        accepted.append(cut)
        out += step.tokens
        # interleave real drafter steps: its cache must be consistent too
        if rng.random() < 0.3:
            out += pair.step().tokens
    assert out == reference[: len(out)]
    assert len(set(accepted)) > 4


def test_history_and_tokens(dflash_b8, reference):
    pair = dflash_b8.pair
    prompt = dflash_b8.tokenize(PROMPT)
    pair.prefill(prompt)
    assert pair.tokens == prompt
    assert pair.n_past == len(prompt) - 1
    s = pair.step(draft=reference[:3])
    assert pair.tokens == prompt + list(s.tokens)
    pair.reset()
    assert pair.n_past == 0 and pair.tokens == []


def test_step_before_prefill_raises(dflash_b8):
    pair = dflash_b8.pair
    pair.reset()
    with pytest.raises(ValueError, match="prefill"):
        pair.step()
    # still usable
    pair.prefill([1, 2, 3])
    assert len(pair.step().tokens) >= 1


def test_bad_step_arguments(dflash_b8):
    pair = dflash_b8.pair
    pair.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="out of range"):
        pair.step(draft=[10**6])
    with pytest.raises(ValueError):
        pair.step(draft_max=-3)
    with pytest.raises(TypeError):
        pair.step(draft_max="4")  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="draft_max=8 exceeds .* clamped to 7"):  # as llama.cpp
        assert pair.step(draft_max=8).n_drafted <= 7
    assert pair.step(draft=list(range(20, 32))).n_drafted == 12  # external drafts are not bounded by the block
    with pytest.raises(ValueError, match="out of range"):
        pair.prefill([1, -5])
    with pytest.raises(ValueError, match="at least one"):
        pair.prefill([])
    pair.prefill([1, 2, 3])
    assert pair.step().n_past == 3


def test_draft_max_changes_between_steps(dflash, baseline):
    ref = baseline.generate("abc", max_tokens=80, ignore_eos=True).tokens
    pair = dflash.pair
    pair.prefill(dflash.tokenize("abc"))
    out: list[int] = []
    for i in range(200):
        step = pair.step(draft_max=i % (pair.max_draft + 1))
        assert step.n_drafted <= i % (pair.max_draft + 1)
        out += step.tokens
        if len(out) >= 80:
            break
    assert out[:80] == ref


def test_pair_properties(dflash_b8):
    pair = dflash_b8.pair
    assert pair.block_size == 8 and pair.max_draft == 7 and pair.default_draft_max == 7
    assert pair.has_drafter and pair.target_layer_ids == [1, 3]
    assert pair.n_ctx == 1024
    assert "ContextPair" in repr(pair)


def test_baseline_pair_has_no_drafter(baseline):
    pair = baseline.pair
    assert not pair.has_drafter and pair.block_size == 0 and pair.max_draft == 0
    pair.prefill([5, 6, 7])
    s = pair.step(draft_max=5)
    assert s.n_drafted == 0 and len(s.tokens) == 1
    # external drafts work without a drafter too (e.g. prompt lookup)
    ref = baseline.generate([5, 6, 7], max_tokens=10, ignore_eos=True).tokens
    pair.prefill([5, 6, 7])
    s = pair.step(draft=ref[:5])
    assert s.n_accepted == 5 and list(s.tokens) == ref[:6]


# The two tests below run in this order (file order): the first leaves a biased
# sampler on the shared object, the second must not inherit it (conftest's
# fresh_shared_pairs resets sampling and caches before every test).
def test_leave_a_biased_sampler_behind(dflash_b8):
    out = dflash_b8.generate("abc", max_tokens=4, logit_bias={65: 1000.0}, ignore_eos=True)
    assert out.tokens == [65] * 4


def test_steps_after_a_biased_generate_are_greedy(dflash_b8, reference):
    pair = dflash_b8.pair
    pair.prefill(dflash_b8.tokenize(PROMPT))
    out: list[int] = []
    while len(out) < 40:
        out += pair.step().tokens
    assert out[:40] == reference[:40]


def test_a_run_of_steps_is_its_steps_one_by_one(baseline, reference):
    # the engine hands a lone sequence's plain steps to the core in runs (Engine._step_run)
    from pydflash import _core

    pair = baseline.pair
    core = pair._core
    pair.prefill(baseline.tokenize(PROMPT))
    run = core.step_run(_core.SeqStep(0, 0), 30, 1000, True)
    assert [t for r in run for t in r.tokens] == reference[:30]
    assert [b.n_past - a.n_past for a, b in zip(run, run[1:])] == [1] * 29
    assert all(r.n_drafted == 0 and r.error == "" for r in run)
    pair.prefill(baseline.tokenize(PROMPT))  # it ends at n_tokens
    assert [t for r in core.step_run(_core.SeqStep(0, 0), 30, 7, True) for t in r.tokens] == reference[:7]
    for n_steps, n_tokens, what in [(0, 5, "n_steps"), (5, 0, "n_tokens")]:
        with pytest.raises(ValueError, match=f"{what} must be at least 1"):
            core.step_run(_core.SeqStep(0, 0), n_steps, n_tokens, True)
    pair.reset()
    with pytest.raises(ValueError, match="prefill"):
        core.step_run(_core.SeqStep(0, 0), 3, 3, True)
    pair.prefill(baseline.tokenize(PROMPT))  # still usable
    assert list(pair.step().tokens) == reference[:1]


def test_runs_of_several_sequences_check_their_counts(baseline):
    from pydflash import _core

    pair = baseline.pair
    core = pair._core
    pair.prefill(baseline.tokenize(PROMPT))
    with pytest.raises(ValueError, match="one count per step"):
        core.step_runs([_core.SeqStep(0, 0)], 3, [3, 3], True)
    with pytest.raises(ValueError, match="n_tokens must be at least 1"):
        core.step_runs([_core.SeqStep(0, 0)], 3, [0], True)
    assert [len(r) for r in core.step_runs([_core.SeqStep(0, 0)], 3, [2], True)] == [2]  # still usable
    pair.reset()


def test_a_run_ends_at_the_end_of_generation_and_before_the_context_is_full(model_dir):
    from pydflash import Llama, _core

    with Llama(model_dir / "target-eos.gguf", n_ctx=64) as llm:
        eos = llm.tokenize("<|endoftext|>", add_bos=False, special=True)[0]
        core = llm.pair._core
        for prompt in ["a", "def", "import os", "x = 1", "class A:", "hello", "1 + 2", "return"]:
            ids = llm.tokenize(prompt)
            llm.pair.prefill(ids)
            full = [t for r in core.step_run(_core.SeqStep(0, 0), 100, 100, False) for t in r.tokens]
            # without stop_at_eog it runs to the full context: the prompt, the steps, the last sampled token
            assert len(full) == 64 - len(ids) + 1
            if eos in full:
                break
        else:
            pytest.fail("no prompt reached EOS: pick others")
        llm.pair.prefill(ids)
        cut = [t for r in core.step_run(_core.SeqStep(0, 0), 100, 100, True) for t in r.tokens]
        assert cut == full[: full.index(eos) + 1]
