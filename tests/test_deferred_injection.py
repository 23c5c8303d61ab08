"""Deferred feature injection: a step that does not use the drafter (plain
decoding, an n-gram or external draft) keeps its rows' target features and
injects them just before the drafter next drafts, in one pass. The drafter then
holds exactly what it would hold had every step injected its rows: its next
block equals the one drafted after a fresh prefill of the same tokens. Checked
through the paths that read or cut the drafter's cache: a long run of plain
steps (injected in passes of at most one drafter ubatch, 512 rows here), a drafter window, a slot file
and the prompt cache; and for a prompt whose rows wait too (``prefill_begin(defer=True)``, what the
engine asks for a generation that starts settled: ``test_adaptive_draft.py``). On the shipped
trained pair, whose blocks depend on the context its drafter holds (``code_tokens``)."""

from __future__ import annotations

import inspect
import random

import pytest

from pydflash import Llama, embedded_pair


def code_tokens(llm: Llama, n: int, skip: int = 0) -> list[int]:
    """``n`` tokens of Python that the embedded pair drafts well: its blocks depend on the
    context its drafter holds, so a drafter that lost or misplaced rows drafts otherwise
    (the tiny random drafter of ``pydflash.gguf_writers`` drafts mostly one token whatever its
    context: a test on it passed with a prompt-cache cut that dropped the drafter's rows)."""
    import json

    src = inspect.getsource(json.decoder) + inspect.getsource(json.encoder)
    return llm.tokenize(src)[skip : skip + n]


def fresh_block(pair, tokens: list[int]) -> list[int]:
    """The drafter's block after a fresh prefill of ``tokens`` (every row injected at once)."""
    pair.reset()
    pair.prefill(tokens)
    return list(pair.step().drafted)


@pytest.fixture(scope="module")
def windowed():
    """The embedded pair whose drafter attends to its last 24 rows only."""
    target, drafter = embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024, draft_window=24) as llm:
        yield llm


@pytest.mark.parametrize("n_plain", [1, 5, 70, 600])  # past 512: injected in a pass midway
@pytest.mark.parametrize("window", [0, 24])
def test_a_run_of_plain_steps_leaves_the_drafter_as_injecting_every_step(embedded_dflash, windowed, n_plain, window):
    llm = windowed if window else embedded_dflash
    pair = llm.pair
    pair.prefill(code_tokens(llm, 40))
    for _ in range(n_plain):
        assert pair.step(draft_max=0).n_drafted == 0
    context = pair.tokens
    after = list(pair.step().drafted)
    assert len(after) == pair.max_draft
    assert after == fresh_block(pair, context)


def test_external_drafts_defer_too(embedded_dflash):
    llm, pair = embedded_dflash, embedded_dflash.pair
    pair.prefill(code_tokens(llm, 30, skip=100))
    for _ in range(6):
        ref = pair.step(draft_max=0).tokens
        pair.step(draft=[ref[-1], 5, 6])  # an outside draft, its first token likely rejected
    context = pair.tokens
    assert list(pair.step().drafted) == fresh_block(pair, context)


def test_a_slot_file_saved_after_plain_steps_holds_every_position(embedded_dflash, tmp_path):
    llm, pair = embedded_dflash, embedded_dflash.pair
    pair.prefill(code_tokens(llm, 30, skip=200))
    for _ in range(12):
        pair.step(draft_max=0)
    context = pair.tokens
    llm.save_slot(0, tmp_path / "slot.bin")
    pair.reset()
    llm.load_slot(0, tmp_path / "slot.bin")
    assert pair.tokens == context
    assert list(pair.step().drafted) == fresh_block(pair, context)


def test_the_prompt_cache_cuts_deferred_rows(embedded_dflash):
    # a new prompt shares the first 45 tokens of a context whose last 20 rows were deferred
    llm, pair = embedded_dflash, embedded_dflash.pair
    pair.prefill(code_tokens(llm, 35, skip=300))
    for _ in range(20):
        pair.step(draft_max=0)
    new = pair.tokens[:45] + code_tokens(llm, 10, skip=600)
    pair.prefill(new, reuse=True)
    assert pair.n_cached == 45
    assert list(pair.step().drafted) == fresh_block(pair, new)


def test_greedy_output_with_plain_and_drafting_steps_mixed_is_the_targets(embedded_dflash, embedded_target):
    rng = random.Random(5)
    prompt = code_tokens(embedded_dflash, 50, skip=400)
    want = embedded_target.generate(prompt, max_tokens=160, ignore_eos=True, cache_prompt=False).tokens
    pair = embedded_dflash.pair
    pair.prefill(prompt)
    out: list[int] = []
    while len(out) < 160:
        out += pair.step(draft_max=rng.choice([0, 0, 0, 3, 7])).tokens
    assert out[:160] == want


def prefill_deferred(llm: Llama, tokens: list[int], reuse: bool = False) -> int:
    """The engine's prefill of a generation that starts settled: the prompt's features
    wait in the sequence like a plain step's (returns the cached prefix's length)."""
    core = llm._engine._core
    cached = core.prefill_begin(0, tokens, reuse, True)
    while core.prefill_remaining(0) > 0:
        core.prefill_some([0], 64)  # in parts: one prompt's deferred rows stay contiguous
    return cached


@pytest.mark.parametrize("n_prompt", [40, 700])  # past 512: injected in a pass midway
def test_a_deferred_prompt_leaves_the_drafter_as_injecting_it(embedded_dflash, n_prompt):
    pair = embedded_dflash.pair
    prefill_deferred(embedded_dflash, code_tokens(embedded_dflash, n_prompt))
    for _ in range(5):
        assert pair.step(draft_max=0).n_drafted == 0
    context = pair.tokens
    after = list(pair.step().drafted)
    assert len(after) == pair.max_draft
    assert after == fresh_block(pair, context)


@pytest.mark.parametrize("drafted", [False, True])
def test_a_deferred_prompt_after_the_prompt_cache_cut_deferred_rows(embedded_dflash, drafted):
    # the cached prefix ends inside rows still deferred (the last prompt's, or plain
    # steps' after a drafting one): the drafter's cache ends where they start, and the
    # new prompt's rows follow them
    llm, pair = embedded_dflash, embedded_dflash.pair
    prefill_deferred(llm, code_tokens(llm, 60))
    if drafted:
        pair.step()
    for _ in range(20):
        pair.step(draft_max=0)
    new = pair.tokens[:70] + code_tokens(llm, 12, skip=300)
    assert prefill_deferred(llm, new, reuse=True) == 70
    assert list(pair.step().drafted) == fresh_block(pair, new)


def test_one_prefill_pass_defers_one_prompt_and_injects_another():
    # two sequences' prompts in one target pass, one deferred (a settled generation) and one
    # injected at once: each drafter sequence ends up as a fresh prefill of its own tokens
    target, drafter = embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024, n_parallel=2, draft_adaptive=False) as llm:
        core = llm._engine._core
        prompts = [code_tokens(llm, 50), code_tokens(llm, 45, skip=200)]
        for seq, defer in ((0, True), (1, False)):
            core.prefill_begin(seq, prompts[seq], False, defer)
        while core.prefill_remaining(0) + core.prefill_remaining(1) > 0:
            core.prefill_some([0, 1], 32)
        assert core.n_deferred(0) == len(prompts[0]) - 1 and core.n_deferred(1) == 0
        blocks = [list(llm.pair.sequence(seq).step().drafted) for seq in (0, 1)]
        for seq in (0, 1):
            pair = llm.pair.sequence(seq)
            assert blocks[seq] == fresh_block(pair, prompts[seq]), seq
