"""The accept/resample rule, decision by decision, against an independent Python reference.

Speculative sampling accepts a drafted token x with probability min(1, p(x)/q(x)) and,
after a rejection, samples the residual max(0, p - q) normalised. The core runs that rule
only inside a step, so the route here is a step whose every input is known outside the
core and whose every random draw is replayed:

* p: the target's rows, read with ``ContextPair.score`` on a separate target-only context
  and put through the numpy reference of llama.cpp's sampler chain
  (``support.sampling.transform``). The core reports its own p of every row whose token it
  emits (post-sampling log-probabilities); that must be within P_CLOSE of the reference
  chain's, and the replay decides on it, free of the rounding by which a verification
  pass's logits differ from ``score``'s;
* q: a drafter whose final norm has zero weights (``DrafterSpec(output_norm_scale=0)``),
  so every logit it gives is exactly 0 and its q is the chain applied to a flat row: a
  logit bias shapes it, and penalties make it differ from block position to block
  position (each drafted token is penalised after it); or an external draft, whose q is
  one-hot;
* the uniforms: the sampler's ``std::mt19937_64`` stream for the seed, replayed in
  Python (``support.accept_rule.MT19937_64``, checked against the C++ standard's known
  answer), consumed in the core's order: the drafter's samples, then per row the accept
  draw, the residual's draw or the bonus token's.

External drafts are replayed with verify="match" too (the target's own sample must equal
the draft). Under a grammar the same holds with p and q the chain on the masked rows (test_grammar.py's
settings; a planted mistake applies the mask after the chain).

For each seed, the drafted block, the emitted tokens and the accepted count must equal
the reference's exactly. A seed where some draw lies within ``AMBIGUOUS`` of its
threshold (float32 probabilities, a verification pass's rounding) is left out, and at
most a few percent may be. The reference with a planted mistake (the ratio inverted:
accept when u < q/p; resampling from p; q of the next block position) disagrees with the
core on many seeds (test_each_planted_mistake_is_told_apart), so the comparison is not
vacuous. This is the gate for the rule's exactness; the rank checks of
test_block_sampling.py and the chi-square checks of test_sampling.py (where their power
is computed: benchmarks/results/sampling-test-power.json) check the distributions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pydflash import Grammar, Llama, gguf_writers
from pydflash.config import SamplingConfig
from support.accept_rule import AMBIGUOUS, MT19937_64, STANDARD_10000TH, chain, replay_step
from support.models import SPREAD, SPREAD_DRAFTER
from support.sampling import GRAMMAR_SETTINGS, NO_POWER, PROMPT, SETTINGS, letters_allowed

BIAS = {3: 3.0, 7: 2.5, 11: 2.0, 250: 1.5, 17: 1.0}
DRAFTED_Q = {  # settings for the zero-logit drafter: no cut that could split tied tokens
    "T1-bias": dict(temperature=1.0, logit_bias=BIAS),
    "T0.8-bias-penalties": dict(temperature=0.8, logit_bias=BIAS, repeat_penalty=1.3,
                                presence_penalty=1.0, frequency_penalty=0.5),
    "T1.2-bias-minp": dict(temperature=1.2, min_p=0.05, logit_bias=BIAS),  # most first drafts rejected
    "T1.2-bias-topnsigma3": dict(temperature=1.2, top_n_sigma=3.0, logit_bias=BIAS),
}  # fmt: skip
EXTERNAL = {**SETTINGS, **NO_POWER}  # test_sampling.py's (the spread target's rows have no ties)
SEEDS = range(200)
MAX_AMBIGUOUS = 0.03
# the core's p against the chain of score()'s rows, per token: a verification pass rounds
# its logits differently (measured here: at most 1e-7 of probability)
P_CLOSE = 1e-4


@pytest.fixture(scope="module")
def zero_q_pair(spread_files, tmp_path_factory: pytest.TempPathFactory):
    """The spread target with a drafter whose logits are all 0, and the target alone."""
    t, _ = spread_files
    d = gguf_writers.write_drafter(tmp_path_factory.mktemp("zero-q") / "d.gguf", SPREAD,
                              dataclasses.replace(SPREAD_DRAFTER, output_norm_scale=0.0))
    with Llama(t, draft=d, n_ctx=256) as llm, Llama(t, n_ctx=256) as base:
        yield llm, base


def run(llm: Llama, base: Llama, kw: dict, seed: int, verify: str, external: list[int] | None,
        grammar: str | None = None, masks=None):
    """One step of the core and the reference's replay of it: (core, reference, inputs)."""
    pair = llm.pair
    n_vocab = base.n_vocab()
    # the core reports p of each emitted token's row (post-sampling log-probabilities)
    cfg = SamplingConfig.build(**kw, verify=verify, grammar=grammar, logprobs=True, top_logprobs=n_vocab,
                               post_sampling_probs=True)
    pair.set_sampling_config(cfg, seed)
    pair.prefill(PROMPT)
    step = pair.step(draft=external) if external else pair.step(draft_max=pair.max_draft)
    drafted = list(step.drafted)
    rows = base.pair.score(PROMPT + drafted)[len(PROMPT) - 1 :].astype(np.float64)
    reported = []
    for lp in step.logprobs:
        reported.append(np.zeros(n_vocab))
        for t, v in lp.top:
            reported[-1][t] = np.exp(v)
    inputs = (seed, rows, np.zeros(n_vocab), external, kw, verify, masks, reported, drafted)
    return (drafted, list(step.tokens), step.n_accepted), replay_step_of(inputs), inputs


def replay_step_of(inputs: tuple, bug: str | None = None):
    seed, rows, flat, external, kw, verify, masks, reported, _ = inputs
    return replay_step(MT19937_64(seed), rows, list(PROMPT), lambda i: flat, external, kw, verify, bug, masks,
                       reported)


def replay(inputs: tuple, bug: str | None = None) -> tuple:
    ref = replay_step_of(inputs, bug)
    return (ref.drafted, ref.tokens, ref.n_accepted)


def p_gap(inputs: tuple, bug: str | None = None) -> float:
    """How far the core's reported p of each emitted row is from the reference chain of the
    target's ``score`` row."""
    _, rows, _, _, kw, _, masks, reported, drafted = inputs
    return max(float(np.abs(p - chain(rows[i], i, (PROMPT + drafted[:i])[-64:], kw, masks, bug)).max())
               for i, p in enumerate(reported))


def check(results: list) -> np.ndarray:
    """The core's p is the reference chain's, and every clear seed decided as the reference;
    returns the accepted counts."""
    gap = max(p_gap(inputs) for _, _, inputs in results)
    print(f"\nlargest p gap {gap:.2e}")
    assert gap < P_CLOSE, gap
    clear = [(core, ref) for core, ref, _ in results if ref.margin >= AMBIGUOUS]
    assert len(clear) >= (1 - MAX_AMBIGUOUS) * len(results), f"{len(results) - len(clear)} ambiguous seeds"
    for core, ref in clear:
        assert core == (ref.drafted, ref.tokens, ref.n_accepted), (core, ref)
    return np.array([core[2] for core, _ in clear])


@pytest.fixture(scope="module")
def drafted_runs(zero_q_pair) -> dict:
    llm, base = zero_q_pair
    return {name: [run(llm, base, kw, s, "rejection", None) for s in SEEDS] for name, kw in DRAFTED_Q.items()}


@pytest.fixture(scope="module")
def external_runs(spread_pair) -> dict:
    llm, base = spread_pair
    draft = base.generate(PROMPT, max_tokens=3, ignore_eos=True).tokens  # the greedy tokens: often accepted
    return {(name, verify): [run(llm, base, kw, s, verify, draft) for s in SEEDS[:100]]
            for name, kw in EXTERNAL.items() for verify in ("rejection", "match")}


LETTERS = "root ::= [a-e]+"  # test_grammar.py's: after a letter the end of generation is allowed too
LONG_LETTERS = "root ::= [a-e]{40}"  # no end within one step: a drafted block never ends early
GRAMMAR_CASES = [("T1", "drafted"), *((name, v) for name in GRAMMAR_SETTINGS for v in ("rejection", "match"))]


@pytest.fixture(scope="module")
def grammar_runs(zero_q_pair, spread_pair) -> dict:
    """Steps under a grammar: the zero-logit drafter's blocks (q: uniform over the letters)
    and external drafts, test_grammar.py's sampling settings."""
    zero, base = zero_q_pair
    first, later = letters_allowed(base, True), letters_allowed(base, False)
    out = {("T1", "drafted"): [run(zero, base, GRAMMAR_SETTINGS["T1"], s, "rejection", None, LONG_LETTERS,
                                   (first, first)) for s in SEEDS[:100]]}
    llm, _ = spread_pair
    draft = base.generate(PROMPT, max_tokens=3, ignore_eos=True, grammar=Grammar(LETTERS)).tokens
    assert all(first[t] for t in draft), draft
    for name, kw in GRAMMAR_SETTINGS.items():
        for verify in ("rejection", "match"):
            out[(name, verify)] = [run(llm, base, kw, s, verify, draft, LETTERS, (first, later)) for s in SEEDS[:100]]
    return out


def test_the_uniform_stream_is_the_standards_mt19937_64():
    rng = MT19937_64(5489)
    for _ in range(9999):
        rng()
    assert rng() == STANDARD_10000TH


@pytest.mark.parametrize("setting", list(DRAFTED_Q))
def test_drafted_blocks_follow_the_rule_draw_by_draw(drafted_runs, setting):
    n_acc = check(drafted_runs[setting])
    print(f"\n{setting}: accepted counts {np.bincount(n_acc, minlength=8).tolist()}")
    if setting != "T1.2-bias-minp":
        # both branches, at the first and the deepest positions: rejections and whole blocks
        assert (n_acc == 0).sum() >= 3 and (n_acc == 7).sum() >= 3 and ((n_acc > 0) & (n_acc < 7)).sum() >= 10


@pytest.mark.parametrize("verify", ["rejection", "match"])
@pytest.mark.parametrize("setting", list(EXTERNAL))
def test_external_drafts_follow_the_rule_draw_by_draw(external_runs, setting, verify):
    n_acc = check(external_runs[(setting, verify)])
    assert (n_acc < 3).any(), "no rejection: the residual path was not exercised"


@pytest.mark.parametrize("case", GRAMMAR_CASES, ids="-".join)
def test_under_a_grammar_the_rule_runs_on_the_masked_chain(grammar_runs, case):
    n_acc = check(grammar_runs[case])
    print(f"\n{case}: accepted counts {np.bincount(n_acc).tolist()}")
    assert (n_acc > 0).any() and (n_acc < n_acc.max()).any(), "accepted and rejected drafts"


@pytest.mark.parametrize("bug", ["ratio-inverted", "resample-from-p", "q-next-position", "mask-after-chain"])
def test_each_planted_mistake_is_told_apart(drafted_runs, external_runs, grammar_runs, bug):
    # the same recorded steps against the reference with one mistake: it must disagree
    # (q-next-position only where q differs by block position: the penalties' setting;
    # mask-after-chain only under a grammar)
    runs = [*drafted_runs.values(), *external_runs.values(), *grammar_runs.values()]
    wrong = sum(core != replay(inputs, bug) or p_gap(inputs, bug) >= P_CLOSE for results in runs
                for core, _, inputs in results)
    print(f"\n{bug}: {wrong} steps differ")
    assert wrong >= 10, f"{bug}: only {wrong} steps differ"
