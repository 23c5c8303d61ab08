"""The adaptive draft length end to end: on by default (``draft_max=None``), lossless,
shown per step; a pinned ``draft_max`` (per call or per ``Llama``) and
``draft_adaptive=False`` draft exactly what they say; the calibration pass."""

from __future__ import annotations

import pytest

from pydflash import Llama
from support.costs import pin_costs
from support.lossless import N_TOKENS, TEXT_PROMPTS

TIE_BOUND = 1.0  # see test_parallel.py: batching moves a tiny model's logits by up to ~0.35


def lengths(res) -> list[int]:
    return [s.draft_max for s in res.stats.steps]


def assert_pinned(res, dm: int, max_tokens: int) -> None:
    """Every step asked the drafter for ``dm`` (a plain step when one token is left)
    and kept no draft past ``max_tokens`` (llama.cpp's budget cut)."""
    n = 0
    for s in res.stats.steps:
        left = max_tokens - n - 1
        assert s.draft_max == (dm if left > 0 else 0)
        assert s.n_drafted <= min(dm, left)
        n += len(s.tokens)


def check_steps(res, block: int) -> None:
    assert res.stats.draft_lengths == tuple(lengths(res))
    for s in res.stats.steps:
        assert 0 <= s.n_accepted <= s.n_drafted <= s.draft_max <= block - 1
        assert len(s.drafted) == s.n_drafted


def memory_bound_guess(monkeypatch) -> None:
    """The policy keeps the uncalibrated guess (verification about as cheap for a few
    rows as for one, as on a GPU) and no online correction of it."""
    from pydflash.draft_length import CostModel

    pin_costs(monkeypatch, CostModel.uncalibrated)


@pytest.mark.parametrize("prompt", TEXT_PROMPTS[:4])
def test_adaptive_is_the_default_and_lossless(dflash, baseline, prompt):
    expected = baseline.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True).tokens
    res = dflash.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True)
    assert res.tokens == expected
    check_steps(res, dflash.pair.block_size)


@pytest.mark.parametrize("drafter", ["b8", "b16"])
def test_adaptive_lengths_follow_acceptance(target_path, model_dir, drafter):
    # the random drafter is mostly rejected: a new pair drafts (its prior), then stops
    # (probes come seldom where a probe costs much, as on these compute-bound models)
    with Llama(target_path, draft=model_dir / f"drafter-{drafter}.gguf", n_ctx=1024) as llm:
        res = llm.generate(TEXT_PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True)
    got = lengths(res)
    # mostly plain steps (a pair whose calibration finds drafting dear may not draft at all)
    assert got.count(0) > len(got) // 2, got
    assert res.stats.n_drafted == 0 or res.stats.acceptance_rate < 0.5  # the reason it stopped


def test_adaptive_on_the_embedded_pair_drafts_long_blocks(embedded_target, monkeypatch):
    # where verification is cheap (a memory-bound target, as on a GPU: the uncalibrated
    # guess, kept as it is), a trained drafter's acceptance is worth whole blocks. On
    # this CPU the embedded target is compute-bound: measured costs and realized rates
    # rightly stop its drafting, so the guess stands in for calibration and online correction
    import pydflash

    memory_bound_guess(monkeypatch)
    prompt = "def fibonacci(n):\n    "
    expected = embedded_target.generate(prompt, max_tokens=96, ignore_eos=True).tokens
    target, drafter = pydflash.embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024) as llm:
        res = llm.generate(prompt, max_tokens=96, ignore_eos=True)
        assert res.tokens == expected
        check_steps(res, llm.pair.block_size)
        assert max(lengths(res)) == llm.pair.max_draft


def test_adaptive_drafts_end_where_the_drafter_is_unsure(embedded_target, monkeypatch):
    # a chosen length comes with the policy's confidence cut (CONFIDENCE_CUT): a DFlash
    # draft ends at the first token the drafter gives less than that probability; a
    # generation's own draft_p_min pins the cut (here: none). Both lossless
    import pydflash

    memory_bound_guess(monkeypatch)
    prompt = "def fibonacci(n):\n    "
    expected = embedded_target.generate(prompt, max_tokens=96, ignore_eos=True).tokens
    target, drafter = pydflash.embedded_pair()

    def cut(res) -> int:  # steps whose draft ended before the length asked, with tokens to spare
        n, out = 0, 0
        for s in res.stats.steps:
            out += s.n_drafted < s.draft_max < 96 - n - 1
            n += len(s.tokens)
        return out

    with Llama(target, draft=drafter, n_ctx=1024) as llm:
        res = llm.generate(prompt, max_tokens=96, ignore_eos=True)
        assert res.tokens == expected
        assert cut(res) > 0
    # a new pair (the policy's estimates of the cut are the first pair's business)
    with Llama(target, draft=drafter, n_ctx=1024) as llm:
        res = llm.generate(prompt, max_tokens=96, ignore_eos=True, draft_p_min=1e-6)
        assert res.tokens == expected
        assert any(s.draft_max > 0 for s in res.stats.steps) and cut(res) == 0


def test_streamed_steps_show_their_length(dflash):
    steps = list(dflash.stream(TEXT_PROMPTS[1], max_tokens=40, ignore_eos=True))
    assert all(0 <= s.draft_max <= dflash.pair.max_draft for s in steps)
    assert all(s.n_drafted <= s.draft_max for s in steps)


def test_a_pinned_draft_max_is_obeyed_exactly(dflash, baseline):
    block = dflash.pair.block_size
    for dm in (0, 1, 3, block - 1):
        res = dflash.generate(TEXT_PROMPTS[2], max_tokens=50, ignore_eos=True, draft_max=dm)
        assert res.tokens == baseline.generate(TEXT_PROMPTS[2], max_tokens=50, ignore_eos=True).tokens
        assert_pinned(res, dm, 50)


def test_a_llama_pinned_draft_max_and_the_off_switch(target_path, model_dir):
    for kw, want in (({"draft_max": 3}, 3), ({"draft_adaptive": False}, 7)):
        with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=512, **kw) as llm:
            assert_pinned(llm.generate(TEXT_PROMPTS[0], max_tokens=60, ignore_eos=True), want, 60)
            assert llm.config.draft_adaptive is ("draft_adaptive" not in kw)
            # a per-call draft_max overrides either
            assert_pinned(llm.generate("x", max_tokens=20, ignore_eos=True, draft_max=2), 2, 20)


def test_a_seeded_sample_keeps_the_fixed_length(dflash):
    # its random draws follow the draft lengths: a seed reproduces it only with fixed lengths
    # (a seeded request's default, verify="coupled", draws none: test_coupled.py)
    a = dflash.generate("def", max_tokens=40, temperature=0.8, seed=42, ignore_eos=True, verify="rejection")
    b = dflash.generate("def", max_tokens=40, temperature=0.8, seed=42, ignore_eos=True, verify="rejection")
    assert a.tokens == b.tokens
    assert_pinned(a, dflash.pair.max_draft, 40)


def test_several_sequences_adaptive_equal_the_target_alone(target_path, model_dir, baseline):
    prompts = [TEXT_PROMPTS[i] for i in range(4)] + [[65, 66, 67], [200] * 9]
    with Llama(target_path, draft=model_dir / "drafter-b16.gguf", n_ctx=4 * 256, n_parallel=4) as llm:
        results = llm.generate_batch(prompts, max_tokens=60, ignore_eos=True)
        assert llm.pair.block_size == 16
    for p, res in zip(prompts, results, strict=True):
        ref = baseline.generate(p, max_tokens=60, ignore_eos=True, logprobs=True, top_logprobs=2)
        check_steps(res, 16)
        if res.tokens != ref.tokens:  # only at a near-tie of the reference (test_parallel.py)
            i = next(i for i, (a, b) in enumerate(zip(res.tokens, ref.tokens, strict=False)) if a != b)
            top = ref.logprobs[i].top
            assert top[0][1] - top[1][1] < TIE_BOUND, f"differs at token {i}, not a near-tie"


def test_bad_values_raise_typed_errors(target_path, model_dir):
    with pytest.raises(TypeError, match="draft_adaptive must be a bool"):
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", draft_adaptive="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_max must be >= 0"):
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", draft_max=-1)


def test_calibrate(dflash_b8):
    core = dflash_b8._engine._core
    cal = core.calibrate(0, 8, 2)
    assert cal.verify_rows == list(range(1, 9)) and len(cal.verify_ms) == 8
    assert cal.draft_rows == list(range(1, 9)) and len(cal.draft_ms) == 8
    assert all(t > 0 for t in cal.verify_ms + cal.draft_ms) and cal.reps == 2 and cal.seconds > 0
    assert core.tokens(0) == [] and not core.has_pending(0)  # left empty
    # bad requests say what to do
    with pytest.raises(ValueError, match=r"max_rows must be in \[1, "):
        core.calibrate(0, 0)
    with pytest.raises(ValueError, match="reps must be >= 1"):
        core.calibrate(0, 4, 0)
    dflash_b8.pair.prefill([1, 2, 3])
    with pytest.raises(ValueError, match=r"calibrate needs an empty sequence.*reset it first"):
        core.calibrate(0, 4)
    assert dflash_b8.pair.n_past == 2  # refused before any work


def test_calibrating_one_sequence_leaves_another_as_it_was(target_path, model_dir):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=512, n_parallel=2) as llm:
        p1 = llm.pair.sequence(1)
        p1.prefill([5, 6, 7, 8])
        first = p1.step(draft_max=3)
        cal = llm._engine._core.calibrate(0, 16, 1)
        assert cal.verify_rows[-1] == 16 and cal.draft_rows[-1] == 16  # two blocks of 8
        after = p1.step(draft_max=3)
        p1.prefill([5, 6, 7, 8])
        p1.step(draft_max=3)
        assert p1.step(draft_max=3).tokens == after.tokens
        assert first.draft_max == 3


def test_the_step_api_keeps_its_draft_max(dflash_b8):
    pair = dflash_b8.pair
    pair.prefill([1, 2, 3])
    assert pair.step().draft_max == pair.max_draft  # None: the pair's default, block size - 1
    assert pair.step(draft_max=2).draft_max == 2
    assert "draft_max=2" in repr(pair.step(draft_max=2))


def test_a_calibration_that_fails_falls_back(target_path, model_dir):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=512) as llm:
        llm._engine._core._inject_fault("target_decode", 0)  # the calibration's first pass fails
        res = llm.generate(TEXT_PROMPTS[0], max_tokens=30, ignore_eos=True)
        assert len(res.tokens) == 30


def test_no_drafter_no_policy(baseline):
    res = baseline.generate("abc", max_tokens=10, ignore_eos=True)
    assert lengths(res) == [0] * 10


def test_the_policy_observes_every_step_taken_once(target_path, model_dir, monkeypatch):
    # its probe clock counts the steps off: a run that the generation's end cut short
    # (max_tokens) counts the steps it took, not those it asked for
    from pydflash.draft_length import DraftPolicy

    seen: list[int] = []
    observe = DraftPolicy.observe
    monkeypatch.setattr(
        DraftPolicy,
        "observe",
        lambda self, *a, **kw: (seen.append(a[-1] if len(a) > 5 else 1), observe(self, *a, **kw))[1],
    )
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=1024) as llm:
        for max_tokens in (N_TOKENS, 5, 300):
            seen.clear()
            res = llm.generate(TEXT_PROMPTS[0], max_tokens=max_tokens, ignore_eos=True)
            assert sum(seen) == res.stats.n_steps


@pytest.mark.parametrize("settled", [False, True])
def test_a_generation_that_starts_off_defers_its_prompts_features(
    embedded_dflash, embedded_target, monkeypatch, settled
):
    # a generation that starts off with no probe due leaves its prompt's features waiting,
    # as its plain steps' (none is injected if it never drafts); one that may draft soon
    # has its prompt injected with the prefill
    from pydflash.draft_length import DraftPolicy

    new_sequence = DraftPolicy.new_sequence

    def starting(self):
        st = new_sequence(self)
        st.quiet = 10**6 if settled else 0
        return st

    monkeypatch.setattr(DraftPolicy, "new_sequence", starting)
    monkeypatch.setattr(DraftPolicy, "choose", lambda self, seqs, caps, floors: [0] * len(seqs))
    prompt = embedded_dflash.tokenize("def parse_header(line):\n    key, _, value = line.partition(':')\n")
    res = embedded_dflash.generate(prompt, max_tokens=24, ignore_eos=True, cache_prompt=False)
    assert res.tokens == embedded_target.generate(prompt, max_tokens=24, ignore_eos=True).tokens
    assert all(s.n_drafted == 0 for s in res.stats.steps)
    core, n_past = embedded_dflash._engine._core, embedded_dflash.pair.n_past
    assert core.n_deferred(0) == (n_past if settled else n_past - (len(prompt) - 1))
