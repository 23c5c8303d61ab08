"""Log-probabilities of generated tokens, read from the verification pass.

The reference is independent of the generation loop: ``ContextPair.score`` of the
whole sequence (one evaluation of prompt + output) and numpy's log-softmax of its
rows; with ``post_sampling_probs`` a numpy model of llama.cpp's chain (top-k, then
temperature) on the same rows. Asking for logprobs never changes the output.

The precision checks run on the embedded trained pair (logits of a real model's
scale, and a drafter that is accepted, so tokens come from every row of the
verification pass); measured there the largest error is ~5e-7. The tiny random
test models have logits of ~100, where score()'s one-batch evaluation and the
verification pass (k + 1 rows) round differently by up to ~0.2 in the far tail
(llama.cpp's CPU kernels sum in a batch-size-dependent order, K/V are f16); they
check the structure only."""

from __future__ import annotations

import numpy as np
import pytest

from pydflash import Llama, TokenLogprob

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\ndef main():", "class Stack:\n    def __init__(self):"]
TOL = 1e-3


@pytest.fixture
def embedded(embedded_dflash: Llama) -> Llama:
    return embedded_dflash


def log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


def reference_rows(llm: Llama, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The target's log-softmax row for each generated token (the row before it)."""
    logits = llm.pair.score(prompt + tokens)
    return log_softmax(logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)])


def check_raw(llm: Llama, prompt: list[int], tokens: list[int], lps: list[TokenLogprob], top_n: int) -> float:
    """Asserts the logprobs and the top lists against the reference; returns the largest error."""
    assert [lp.token for lp in lps] == tokens
    ref = reference_rows(llm, prompt, tokens)
    worst = 0.0
    for row, t, lp in zip(ref, tokens, lps):
        worst = max(worst, abs(lp.logprob - row[t]))
        assert len(lp.top) == top_n
        ids = [i for i, _ in lp.top]
        vals = [v for _, v in lp.top]
        assert vals == sorted(vals, reverse=True)
        worst = max(worst, max((abs(v - row[i]) for i, v in lp.top), default=0.0))
        # the reference's top set, up to near-ties at the cut
        if top_n:
            cut = np.sort(row)[-top_n]
            assert all(row[i] >= cut - TOL for i in ids)
    assert worst < TOL, worst
    return worst


@pytest.mark.parametrize("text", PROMPTS, ids=range(len(PROMPTS)))
def test_greedy_logprobs_equal_log_softmax_of_score(embedded: Llama, text: str):
    prompt = embedded.prompt_tokens(text)
    dm = embedded.pair.max_draft  # pinned: the adaptive length may stop drafting on a prompt
    plain = embedded.generate(prompt, max_tokens=40, ignore_eos=True, draft_max=dm)
    r = embedded.generate(prompt, max_tokens=40, ignore_eos=True, logprobs=True, top_logprobs=5, draft_max=dm)
    assert r.tokens == plain.tokens and plain.logprobs is None
    assert r.logprobs is not None and len(r.logprobs) == len(r.tokens) == 40
    assert r.stats.n_accepted > 0  # tokens came from drafted rows too, not only row 0
    check_raw(embedded, prompt, r.tokens, r.logprobs, 5)
    # greedy: the chosen token is the most likely one
    assert all(lp.top[0][0] == lp.token for lp in r.logprobs)


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_sampled_logprobs_equal_log_softmax_of_score(embedded: Llama, verify: str):
    prompt = embedded.prompt_tokens(PROMPTS[0])
    kw = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.6, "seed": 11, "verify": verify}
    plain = embedded.generate(prompt, **kw)
    r = embedded.generate(prompt, logprobs=True, top_logprobs=3, **kw)
    assert r.tokens == plain.tokens
    assert r.logprobs is not None and r.stats.n_accepted > 0
    check_raw(embedded, prompt, r.tokens, r.logprobs, 3)


def test_target_alone_reports_logprobs(embedded_target: Llama):
    prompt = embedded_target.prompt_tokens(PROMPTS[1])
    r = embedded_target.generate(prompt, max_tokens=24, ignore_eos=True, logprobs=True)
    assert r.logprobs is not None
    check_raw(embedded_target, prompt, r.tokens, r.logprobs, 0)


def test_post_sampling_probs_follow_the_chain(embedded: Llama):
    """After top-k (5) and temperature (0.7), in llama.cpp's order: the reported
    distribution is softmax(logits / T) over the 5 best raw logits."""
    prompt = embedded.prompt_tokens(PROMPTS[2])
    # verify pinned as it was before a seeded request defaulted to "coupled": the same tokens, away
    # from near-ties where the batched rows and the scoring pass differ by float rounding
    kw = {"max_tokens": 32, "ignore_eos": True, "temperature": 0.7, "top_k": 5, "seed": 3, "verify": "rejection"}
    r = embedded.generate(prompt, logprobs=True, top_logprobs=8, post_sampling_probs=True, **kw)
    assert r.logprobs is not None
    raw = embedded.pair.score(prompt + r.tokens)[len(prompt) - 1 : len(prompt) - 1 + len(r.tokens)]
    for row, lp in zip(raw.astype(np.float64), r.logprobs):
        best = np.argsort(-row, kind="stable")[:5]
        ref = log_softmax(row[best] / 0.7)
        assert len(lp.top) == 5  # the chain kept 5 tokens; asking for 8 gives those 5
        got = dict(lp.top)
        assert set(got) == set(best.tolist())
        for i, v in zip(best.tolist(), ref):
            assert abs(got[i] - v) < TOL
        assert abs(lp.logprob - got[lp.token]) < 1e-6
        assert abs(sum(np.exp(v) for v in got.values()) - 1.0) < 1e-4


def test_post_sampling_probs_greedy_is_one_hot(dflash_b8: Llama):
    r = dflash_b8.generate([7], max_tokens=8, ignore_eos=True, logprobs=True, top_logprobs=2, post_sampling_probs=True)
    assert r.logprobs is not None
    assert all(lp.logprob == 0.0 and lp.top == ((lp.token, 0.0),) for lp in r.logprobs)


def test_stream_logprobs_match_the_result_and_follow_stop_strings(dflash_b8: Llama):
    prompt = [1, 2, 3, 4, 5]
    # compared exactly: the same draft lengths (other batch shapes move the last bits of a row)
    full = dflash_b8.generate(prompt, max_tokens=30, ignore_eos=True, logprobs=True, draft_max=7)
    assert full.logprobs is not None
    streamed = []
    tokens = []
    for step in dflash_b8.stream(prompt, max_tokens=30, ignore_eos=True, logprobs=True, draft_max=7):
        assert step.logprobs is not None and len(step.logprobs) == len(step.tokens)
        streamed += step.logprobs
        tokens += step.tokens
    assert tokens == full.tokens
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in full.logprobs]
    # a stop string cuts tokens and their logprobs alike
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    cut = dflash_b8.generate(prompt, max_tokens=30, ignore_eos=True, logprobs=True, stop=stop)
    assert cut.finish_reason == "stop" and cut.logprobs is not None
    assert len(cut.logprobs) == len(cut.tokens) < len(full.tokens)
    assert [lp.token for lp in cut.logprobs] == cut.tokens


def test_bad_logprob_options_raise_and_leave_the_model_usable(dflash_b8: Llama):
    with pytest.raises(ValueError, match="top_logprobs needs logprobs=True"):
        dflash_b8.generate([7], max_tokens=2, top_logprobs=3)
    with pytest.raises(ValueError, match="top_logprobs must be >= 0"):
        dflash_b8.generate([7], max_tokens=2, logprobs=True, top_logprobs=-1)
    with pytest.raises(TypeError, match="logprobs must be a bool"):
        dflash_b8.generate([7], max_tokens=2, logprobs=1)  # type: ignore[arg-type]
    n_vocab = dflash_b8.n_vocab()
    with pytest.raises(ValueError, match=r"top_logprobs must be <= n_vocab"):
        dflash_b8.generate([7], max_tokens=2, logprobs=True, top_logprobs=n_vocab + 1)
    r = dflash_b8.generate([7], max_tokens=4, ignore_eos=True, logprobs=True, top_logprobs=n_vocab)
    assert r.logprobs is not None and len(r.logprobs[0].top) == n_vocab
