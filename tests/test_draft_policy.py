"""The adaptive draft length's decisions on synthetic costs and acceptances
(no model): ``pydflash.drafting.policy``."""

from __future__ import annotations

import copy
import itertools
import math

import pytest

from pydflash.drafting import policy as _draft_policy
from pydflash.drafting.acceptance import expected_gains
from pydflash.drafting.cost import SPEED_GATE
from pydflash.drafting.policy import (
    CHOICE_BUDGET,
    PLAIN_SAMPLE,
    PREFILL_STEPS,
    PROBE_ALPHA,
    PROBE_BUDGET,
    PROBE_FIRST,
    PROBE_MAX,
    PROBE_NEWS,
    PROBE_ROOM,
    PROBE_WAIT_MAX,
    RATE_DECAY,
    RECHECK,
    RECHECK_MAX,
    SWITCH_STEPS,
    Acceptance,
    Choice,
    CostModel,
    DraftPolicy,
    choose_lengths,
    drafter_rows,
    expected_tokens,
)

MAX_DRAFT = 15  # a block of 16


def seasoned(p: DraftPolicy) -> DraftPolicy:
    """``p`` as if it had observed PROBE_NEWS drafting steps (budgeted probe spacing)."""
    p.news = PROBE_NEWS
    return p


def cost(verify_per_row: float, draft_ms: float = 0.2, verify_ms: float = 10.0, max_rows: int = 64) -> CostModel:
    """A target pass of r rows: verify_ms + verify_per_row * (r - 1); a drafter pass: draft_ms flat."""
    rows = list(range(1, max_rows + 1))
    return CostModel(rows, [verify_ms + verify_per_row * (r - 1) for r in rows], rows, [draft_ms] * max_rows, max_rows)


def policy(c: CostModel, acceptance: float, n_steps: int = 40) -> tuple[DraftPolicy, list]:
    """A policy with one sequence that has seen ``n_steps`` steps of full drafts, each
    position kept with probability ``acceptance`` (fed as the expected pattern)."""
    p = DraftPolicy(c, MAX_DRAFT)
    st = p.new_sequence()
    for _ in range(n_steps):
        feed(p, st, acceptance)
    return p, [st]


def feed(p: DraftPolicy, st, acceptance: float, n: int = MAX_DRAFT) -> None:
    """Steps whose accepted count follows the conditional rate ``acceptance`` (a deterministic
    mix: position i kept in a fraction acceptance**i of steps, as a geometric run does)."""
    # 20 steps: the run length of each drawn from the geometric law's quantiles
    for q in range(20):
        p.observe_sequence(st, n, geometric_run(q, acceptance, n))


def unsettle(monkeypatch) -> None:
    """Sequences that are off are never settled: their weighings keep coming every
    ``recheck`` steps, as for an estimate that could still drift to drafting."""
    monkeypatch.setattr(DraftPolicy, "_settled", lambda self, st: False)


def geometric_run(q: int, c: float, k: int) -> int:
    """Tokens a draft of ``k`` keeps at the ``q``-th of 20 quantiles (0..19) when each
    position is kept with conditional rate ``c``."""
    u = (q + 0.5) / 20
    a = 0
    while a < k and u < c ** (a + 1):
        a += 1
    return a


def test_expected_tokens():
    assert expected_tokens([0.5, 0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([1.0] * 7, 7) == 8.0
    assert expected_tokens([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)


def test_low_acceptance_stops_speculating():
    p, sts = policy(cost(0.5), acceptance=0.02)
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]


def test_high_acceptance_and_cheap_verification_drafts_the_whole_block():
    p, sts = policy(cost(0.05), acceptance=0.95)
    assert p.choose(sts, [MAX_DRAFT], [0]) == [MAX_DRAFT]


def test_costly_rows_shorten_the_draft():
    # the same acceptance: a verification whose rows cost more drafts less
    ks = []
    for per_row in (0.05, 1.0, 3.0):
        p, sts = policy(cost(per_row), acceptance=0.8)
        ks.append(p.choose(sts, [MAX_DRAFT], [0])[0])
    assert ks[0] > ks[1] > ks[2] >= 0, ks


def test_busy_sequences_draft_shorter():
    # verification compute-bound past a few rows: several sequences share it
    c = cost(0.8)
    p, sts = policy(c, acceptance=0.8)
    alone = p.choose(sts, [MAX_DRAFT], [0])[0]
    many = [p.new_sequence() for _ in range(8)]
    for st in many:
        feed(p, st, 0.8)
    together = p.choose(many, [MAX_DRAFT] * 8, [0] * 8)
    assert alone > 0
    assert max(together) < alone, (alone, together)


def test_many_busy_sequences_with_low_acceptance_stop():
    p, _ = policy(cost(1.0), acceptance=0.3)
    many = [p.new_sequence() for _ in range(8)]
    for st in many:
        feed(p, st, 0.3)
    assert p.choose(many, [MAX_DRAFT] * 8, [0] * 8) == [0] * 8


def test_the_joint_choice_is_no_worse_than_any_uniform_length():
    c = cost(0.6)
    gains = [[expected_tokens([a] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)] for a in (0.9, 0.5, 0.7)]
    choices = [Choice(g, 0, MAX_DRAFT) for g in gains]
    ks = choose_lengths(c, choices)

    def rate(ks: list[int]) -> float:
        rows = sum(1 + k for k in ks)
        drows = sum(1 + k for k in ks if k > 0)
        return sum(g[k] for g, k in zip(gains, ks, strict=True)) / c.step_ms(rows, drows)

    for k in range(MAX_DRAFT + 1):
        assert rate(ks) >= rate([k] * 3) - 1e-12
    assert ks[0] >= ks[2] >= ks[1]  # the better a sequence's acceptance, the longer its draft


def test_recovery_after_a_probe():
    p, sts = policy(cost(0.5), acceptance=0.02)
    st = sts[0]
    lengths = []
    while not lengths or lengths[-1] == 0:
        lengths.append(p.choose(sts, [MAX_DRAFT], [0])[0])
        assert len(lengths) < 2000
    # the first probe waits PROBE_FIRST steps, longer when probing costs much (here: ~7 ms
    # lost against 10 ms plain steps, 2%: 35 steps)
    assert len(lengths) >= PROBE_FIRST
    assert lengths[-1] == MAX_DRAFT and st.probing  # the probe: a full draft
    p.observe_sequence(st, MAX_DRAFT, MAX_DRAFT)  # the drafter agrees again
    assert p.choose(sts, [MAX_DRAFT], [0])[0] > 0
    feed(p, st, 0.95)
    assert p.choose(sts, [MAX_DRAFT], [0])[0] >= MAX_DRAFT - 2


def probe_gaps(c: CostModel, n_steps: int) -> tuple[list[int], float]:
    """Steps between failed probes of a sequence whose drafts are all rejected, and the
    share of the time the probes lost against plain steps (the costs as modelled)."""
    p, sts = policy(c, acceptance=0.02)
    st = sts[0]
    gaps, last, lost, total = [], 0, 0.0, 0.0
    for i in range(1, n_steps):
        k = p.choose(sts, [MAX_DRAFT], [0])[0]
        ms = c.step_ms(1 + k, 1 + k if k else 0)
        total += ms
        if k:
            assert st.probing
            p.observe_sequence(st, k, 0)
            lost += ms - c.step_ms(1, 0)  # it yielded the one token a plain step yields
            gaps.append(i - last)
            last = i
    return gaps, lost / total


def test_cheap_probes_double_their_wait_up_to_probe_max():
    # memory-bound (as on a GPU): a full draft costs little more than a plain step (7.5%)
    gaps, share = probe_gaps(cost(0.01, draft_ms=0.6), 400)
    assert PROBE_FIRST <= gaps[0] < 2 * PROBE_FIRST  # the first: what PROBE_BUDGET allows, at least
    assert gaps == sorted(gaps) and max(gaps) == PROBE_MAX
    assert share <= PROBE_BUDGET


def test_costly_probes_stay_within_their_budget():
    # compute-bound: a probe of 16 rows costs 2.5x a plain step, so probes come seldom
    gaps, share = probe_gaps(cost(1.0, draft_ms=2.0), 3000)
    assert gaps[0] > PROBE_MAX
    assert 0 < share <= PROBE_BUDGET * 1.05, share


def test_pinned_lengths_are_kept_and_draft_min_is_a_floor():
    p, sts = policy(cost(1.0), acceptance=0.6)
    other = p.new_sequence()
    feed(p, other, 0.6)
    free = p.choose(sts, [MAX_DRAFT], [0])[0]
    assert 0 < free < MAX_DRAFT
    # a pinned sequence beside an adaptive one keeps its length
    assert p.choose([None, other], [5, MAX_DRAFT], [0, 0])[0] == 5
    # draft_min above the best length: 0 or at least draft_min, never in between
    for floor in (free + 1, free + 3):
        k = p.choose(sts, [MAX_DRAFT], [floor])[0]
        assert k == 0 or k >= floor
    # a cap (max_tokens, the context) bounds the choice
    assert p.choose(sts, [2], [0])[0] <= 2


def test_the_cost_model_follows_measured_steps():
    c = cost(0.5)
    before = c.verify_ms(8)
    for _ in range(100):  # steps take twice as long as calibrated (a longer context, a busy machine)
        c.observe(8, 2 * before, 0, 0.0, 3.0)
    assert c.verify_ms(8) == pytest.approx(2 * before, rel=1e-3)
    # the overhead of plain steps and of steps with a drafter pass are learned apart
    assert c.plain_overhead_ms == pytest.approx(3.0, rel=1e-3)
    assert c.overhead_ms == 0.0
    for _ in range(100):
        c.observe(8, 2 * before, 8, 0.2, 5.0)
    assert c.overhead_ms == pytest.approx(5.0, rel=1e-3)
    assert c.plain_overhead_ms == pytest.approx(3.0, rel=1e-3)
    assert c.step_ms(8, 8) - c.step_ms(8, 0) == pytest.approx(c.draft_ms(8) + 2.0, rel=1e-3)
    # a slower verification shortens the choice (with the same acceptance)
    p, sts = policy(cost(0.5), acceptance=0.8)
    k_before = p.choose(sts, [MAX_DRAFT], [0])[0]
    v9, v16 = p.cost.verify_ms(9), p.cost.verify_ms(16)
    for _ in range(100):  # many rows cost 3-4x more than calibrated
        p.observe_step(9, 3 * v9, 0, 0.0, 3 * v9)
        p.cost.observe(16, 4 * v16, 0, 0.0, 0.0)
    assert p.choose(sts, [MAX_DRAFT], [0])[0] <= k_before


def test_each_pass_size_learns_its_own_time():
    # a 1-row pass measured at half its calibrated time (llama.cpp reuses its graph
    # over a run of plain steps): that size takes its own time; sizes not seen take
    # their seen neighbours' measured / calibrated ratios, interpolated
    c = cost(0.5)
    v1, v3, v5, v9 = (c.verify_ms(r) for r in (1, 3, 5, 9))
    for _ in range(200):
        c.observe(1, v1 / 2, 0, 0.0, 0.0)
    assert c.verify_ms(1) == pytest.approx(v1 / 2, rel=1e-3)
    assert c.verify_ms(9) == pytest.approx(v9 / 2, rel=1e-3)  # beyond the seen sizes: the nearest's ratio
    for _ in range(200):
        c.observe(5, 2 * v5, 8, 0.2, 0.0)
    assert c.verify_ms(5) == pytest.approx(2 * v5, rel=1e-3)
    assert c.verify_ms(3) == pytest.approx(v3 * (0.5 + 0.5 * (2 - 0.5)), rel=1e-3)  # halfway between 1 and 5


def test_cost_tables_interpolate_and_never_decrease():
    c = CostModel([1, 4, 8], [1.0, 0.9, 2.0], [1, 8], [0.1, 0.5], 16)
    assert c.verify_ms(1) == 1.0
    assert c.verify_ms(4) == 1.0  # measured 0.9: noise, a pass of more rows is not cheaper
    assert c.verify_ms(6) == pytest.approx(1.45)
    assert c.verify_ms(12) == pytest.approx(2.0 + (1.1 / 4) * 4)  # along the last slope
    assert c.draft_ms(0) == 0.0  # no drafter pass at all
    assert c.draft_ms(8) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="as many times as sizes"):
        CostModel([1, 2], [1.0], [], [], 4)
    with pytest.raises(ValueError, match="max_rows must be >= 1"):
        CostModel([1], [1.0], [], [], 0)


def test_acceptance_estimate():
    a = Acceptance(4, prior=0.6)
    assert a.conditional() == pytest.approx([0.6] * 4)
    for _ in range(30):
        a.observe(4, 1)  # the first position kept, the second rejected, the rest untried
    c = a.conditional()
    assert c[0] > 0.9 and c[1] < 0.2
    # untried: the position before where that is higher than the prior, else the prior (a
    # rejected position says nothing of the ones after it)
    assert c[2] == pytest.approx(0.6) and c[3] == pytest.approx(0.6)
    b = Acceptance(4, prior=0.6)
    for _ in range(30):
        b.observe(1, 1)  # only the first position drafted, always kept
    assert b.conditional()[1] == pytest.approx(b.conditional()[0]) and b.conditional()[0] > 0.9
    # a new sequence's prior is the pair's running estimate of the first position
    p = DraftPolicy(cost(0.5), 4)
    for _ in range(100):
        p.observe_sequence(p.new_sequence(), 4, 0)
    assert p.new_sequence().acceptance.conditional()[0] < 0.1


def test_the_drafter_pass_costs_its_whole_block():
    # a drafter pass computes the whole block whatever the step keeps of it: with a
    # costly drafter (compute-bound) a short draft is charged 16 rows, not 1 + k
    rows = list(range(1, 65))
    c = CostModel(rows, [10.0 + 0.5 * (r - 1) for r in rows], rows, [0.5 * r for r in rows], 64)
    choices = [Choice([expected_tokens([0.7] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)]
    by_k = choose_lengths(c, choices)[0]
    whole = choose_lengths(c, choices, pass_rows=MAX_DRAFT + 1)[0]
    assert by_k > 0
    assert whole == 0 or whole > by_k  # paying for 16 rows anyway: none, or a longer draft
    p = DraftPolicy(c, MAX_DRAFT, pass_rows=MAX_DRAFT + 1)
    assert p.pass_rows == MAX_DRAFT + 1


def test_a_lone_sequence_that_is_off_still_forgets_every_step():
    # between checks (every RECHECK steps) the choice is not weighed again, but the
    # estimate's drift toward the pair's counts every step off, the probe's included
    p, sts = policy(cost(0.5), acceptance=0.02)
    st = sts[0]
    ref = Acceptance(MAX_DRAFT, p.pooled)
    ref._hit, ref._try = list(st.acceptance._hit), list(st.acceptance._try)
    n_off = 0
    while p.choose(sts, [MAX_DRAFT], [0])[0] == 0:
        n_off += 1
        assert n_off < 2000
    assert st.probing and n_off >= RECHECK
    ref.forget(n_off + 1)
    assert st.acceptance.conditional() == pytest.approx(ref.conditional(), rel=1e-9)


def test_the_weighings_of_a_sequence_that_is_off_keep_to_their_budget(monkeypatch):
    # a weighing that takes 0.05 ms beside plain steps of 10 ms: one every 4 steps at least
    # (RECHECK); at 1 ms plain steps (a small CPU target) one every 20, not every 4, and one
    # slow weighing (the thread was preempted) moves the interval a quarter of the way
    now = [0.0]
    took = [0.05e-3]

    def clock() -> float:
        now[0] += took[0]  # a weighing reads it before and after: it took took[0]
        return now[0]

    monkeypatch.setattr(_draft_policy.time, "perf_counter", clock)
    unsettle(monkeypatch)
    for plain_ms, want in [(10.0, RECHECK), (1.0, 32)]:
        p, sts = policy(cost(0.5, verify_ms=plain_ms), acceptance=0.02)
        sts[0].spacing = 10**6  # no probes
        weighed = 0
        for _ in range(400):
            if not p.skip(sts[0]):
                weighed += 1
                assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
        assert p.recheck == want
        assert weighed * 0.05 <= CHOICE_BUDGET * 400 * plain_ms + 0.05 * RECHECK
    took[0] = 0.45e-3  # 9x the others: the average goes to 0.15 ms, 60 steps at 1 ms (64)
    while p.skip(sts[0]):
        pass
    p.choose(sts, [MAX_DRAFT], [0])
    assert p.recheck == 64


def test_weighings_that_take_a_little_more_or_less_stay_as_far_apart(monkeypatch):
    # the interval between weighings follows their measured time, which jitters: it moves
    # in powers of two, so the next weighing stays where the steps since the last one put
    # it (as the interval was 62, 63, 61 steps, a weighing came 7 steps after the last)
    unsettle(monkeypatch)
    p, sts = policy(cost(0.5, verify_ms=0.3), acceptance=0.02)
    sts[0].spacing = 10**6  # no probes
    # 0.041-0.052 ms against plain steps of 0.3 ms: 55-70 steps apart for CHOICE_BUDGET
    took = iter([0.050e-3, 0.045e-3, 0.048e-3, 0.041e-3, 0.052e-3] * 1000)
    readings = [0]

    def clock() -> float:  # a weighing reads it before and after: it took the next of took
        readings[0] += 1
        return next(took) if readings[0] % 2 == 0 else 0.0

    p.timer = clock
    at: list[int] = []
    step = 0
    while len(at) < 40:
        n = p.plain_run(sts[0], 1000)
        if n == 0:
            assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
            at.append(step)
            n = 1
        step += n
    gaps = {b - a for a, b in itertools.pairwise(at[5:])}
    assert gaps == {p.recheck} and p.recheck == RECHECK_MAX


def test_an_off_sequence_that_no_drift_can_turn_on_is_weighed_again_only_after_news():
    # its estimate and the pair's both low: while off its estimate only moves toward the
    # pair's, so until the pair's changes (a drafting step's news) each weighing could only
    # say 0 again. None comes (before: one every RECHECK steps here); each step it skipped,
    # a weighing would have chosen 0
    p, sts = policy(cost(0.5), acceptance=0.02)
    st = sts[0]
    st.spacing = 10**6  # no probes
    p.timer = lambda: 0.0  # weighings take no time: without settling, one every RECHECK steps
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
    assert st.settled == p.news
    for _ in range(300):
        assert p.skip(st)
        q, qst = copy.deepcopy((p, st))
        assert q._choose([qst], [MAX_DRAFT], [0]) == [0]
    assert p.plain_run(st, 1000) == 1000
    other = p.new_sequence()
    p.observe_sequence(other, MAX_DRAFT, MAX_DRAFT)  # another sequence's drafts were kept
    assert [p.skip(st) for _ in range(RECHECK)].count(False) == 1


def test_an_off_sequence_whose_estimate_can_drift_to_drafting_keeps_being_weighed():
    # the pair's estimate says drafting pays, this sequence's own drafts failed: it is off,
    # and its estimate drifts back to the pair's, so a later weighing turns drafting on
    p = DraftPolicy(cost(2.0), MAX_DRAFT)  # at the pair's prior (0.6) a draft of 1 pays
    st = p.new_sequence()
    st.spacing = 10**6  # no probes
    for _ in range(30):
        st.acceptance.observe(MAX_DRAFT, 0)
    assert p.choose([st], [MAX_DRAFT], [0]) == [0]
    assert st.settled == -1
    for _ in range(200):
        if not p.skip(st) and p.choose([st], [MAX_DRAFT], [0]) != [0]:
            break
    else:
        pytest.fail("drafting never came back")


def test_a_new_generation_after_a_settled_one_starts_without_a_weighing():
    p, sts = policy(cost(0.5), acceptance=0.02)
    sts[0].spacing = 10**6  # no probes
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
    p.end_sequence(sts[0])
    nxt = p.new_sequence()  # its estimate is the pair's: no higher than the last one's bound
    assert nxt.settled == p.news and p.skip(nxt)
    p.observe_sequence(p.new_sequence(), MAX_DRAFT, MAX_DRAFT)  # news
    p.end_sequence(nxt)
    last = p.new_sequence()
    assert last.settled == -1 and not p.skip(last)


def test_one_slow_pass_moves_a_size_a_tenth_of_the_way():
    # the first 1-row pass after a drafting step rebuilds llama.cpp's graph: one such
    # pass must not make plain steps look dear for the rest of a generation
    c = cost(0.5)
    v1 = c.verify_ms(1)
    c.observe(1, 5 * v1, 0, 0.0, 0.0)
    assert c.verify_ms(1) == pytest.approx(v1 * 1.4)
    for _ in range(30):
        c.observe(1, v1, 0, 0.0, 0.0)
    assert c.verify_ms(1) == pytest.approx(v1, rel=0.02)


def test_short_generations_share_one_probe_clock():
    # a pair whose probes are dear (a compute-bound target: 8 rows cost 4.5x one) and
    # whose drafting does not pay, used for many short generations: each new one keeps
    # the last one's count of steps off and probe spacing, so it probes as in one long
    # generation (before, a generation shorter than the spacing never probed: a pair
    # that had stopped drafting could not find out that it should start again)
    def probes(c: CostModel, gen_len: int, n_gens: int) -> int:
        p, sts = policy(c, acceptance=0.02)
        p.end_sequence(sts[0])
        n = 0
        for _ in range(n_gens):
            st = p.new_sequence()
            for _ in range(gen_len):
                if p.choose([st], [MAX_DRAFT], [0])[0] > 0:
                    n += 1
                    p.observe_sequence(st, MAX_DRAFT, 0)
            p.end_sequence(st)
        return n

    dear = cost(5.0)
    long_run = probes(dear, 8960, 1)
    assert long_run >= 10
    assert long_run - 2 <= probes(dear, 128, 70) <= long_run + 2
    # cheap probes (a memory-bound target): a new prompt is probed soon, as in a new pair
    p, sts = policy(cost(0.05, draft_ms=0.6), acceptance=0.02)
    for _ in range(300):
        if p.choose(sts, [MAX_DRAFT], [0])[0] > 0:
            p.observe_sequence(sts[0], MAX_DRAFT, 0)
    assert sts[0].probe_wait == PROBE_MAX
    p.end_sequence(sts[0])
    st = p.new_sequence()
    first = next(i for i in range(100) if p.choose([st], [MAX_DRAFT], [0])[0] > 0)
    assert first < PROBE_MAX // 2


def test_a_generation_that_ends_drafting_passes_no_clock():
    p, sts = policy(cost(0.5), acceptance=0.9)
    st = sts[0]
    assert p.choose([st], [MAX_DRAFT], [0])[0] > 0
    p.end_sequence(st)
    new = p.new_sequence()
    assert new.off_steps == 0 and new.probe_wait == PROBE_FIRST


def test_drafting_that_realizes_less_than_plain_steps_stops():
    # the model expects drafting to pay (cheap verification, high acceptance), but a
    # lone sequence's drafting steps gave fewer tokens per ms than its plain steps (a
    # compute-bound target, costs the calibration missed): it goes off, and probes on
    p, sts = policy(cost(0.05), acceptance=0.8)
    assert p.choose(sts, [MAX_DRAFT], [0])[0] > 0
    for _ in range(10):
        p.observe_lone(1, False, 1.0)  # plain: 1 token per ms
        p.observe_lone(4, True, 5.0)  # drafting: 0.8 tokens per ms
    assert p.drafting_loses()
    ks = [p.choose(sts, [MAX_DRAFT], [0])[0] for _ in range(200)]
    assert ks[0] == 0
    assert any(k > 0 for k in ks) and all(k in (0, MAX_DRAFT) for k in ks)  # probes only
    # probes that realize more than plain steps bring drafting back
    for _ in range(10):
        p.observe_lone(6, True, 2.0)
    assert not p.drafting_loses()
    assert any(p.choose(sts, [MAX_DRAFT], [0])[0] > 0 for _ in range(RECHECK))  # at its next weighing


def test_drafting_that_loses_for_its_acceptance_is_the_estimates_business_not_a_veto():
    # a memory-bound pair whose steps cost what the model says: drafting steps that kept
    # nothing (a generation's start, where drafts keep less) realized less than plain
    # steps, but so would they at the model's costs: the acceptance estimates weigh that
    # step by step. Vetoed, drafting stayed off until a probe (on the padded pair for
    # whole generations in which a fixed draft of 2 gave 1.3-1.4x the target alone)
    p, sts = policy(cost(0.5), acceptance=0.8)
    st = sts[0]
    plain = p.cost.step_ms(1, 0)
    for _ in range(10):
        p.observe_lone(1, False, plain)
    for _ in range(8):  # drafts of 2 that keep nothing, each at the model's time
        p.observe_sequence(st, 2, 0)
        p.observe_lone(1, True, p.cost.step_ms(3, drafter_rows(2, p.pass_rows)), k=2)
    assert p._realized() < 1.0 and not p.drafting_loses()
    # the drafts keep again: drafting goes on as the estimates say, with no probe between
    for _ in range(3):
        feed(p, st, 0.8)
    ks = [p.choose(sts, [MAX_DRAFT], [0])[0] for _ in range(RECHECK + 1)]
    assert any(ks) and not st.probing
    # the same tokens in 3x the model's time (costs it misses): a veto, probes only
    p, sts = policy(cost(0.5), acceptance=0.8)
    for _ in range(10):
        p.observe_lone(1, False, plain)
    for _ in range(8):
        p.observe_lone(3, True, 3 * p.cost.step_ms(3, drafter_rows(2, p.pass_rows)), k=2)
    assert p.drafting_loses()
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]


def test_realized_rates_need_both_kinds_of_step():
    p, sts = policy(cost(0.05), acceptance=0.8)
    for _ in range(10):
        p.observe_lone(1, True, 10.0)  # drafting only (a pair that always drafts)
    assert not p.drafting_loses()
    assert p.choose(sts, [MAX_DRAFT], [0])[0] > 0


def test_the_switch_back_to_plain_steps_is_charged_to_probes():
    # the first plain step after a drafting one rebuilds llama.cpp's graphs (2x a plain
    # step on the embedded target): its excess is learned apart, kept out of the plain
    # steps' costs, and spaces probes further apart
    p = seasoned(DraftPolicy(cost(0.5), MAX_DRAFT))
    c = Choice([expected_tokens([0.3] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    plain = p.cost.step_ms(1, 0)
    spacing = p.probe_spacing(c)
    for _ in range(100):
        p.observe_step(1 + MAX_DRAFT, p.cost.verify_ms(1 + MAX_DRAFT), 16, 0.2, p.cost.step_ms(1 + MAX_DRAFT, 16))
        p.observe_step(1, plain, 0, 0.0, plain + 10.0)  # the switch: 10 ms more than a plain step
        for _ in range(SWITCH_STEPS + 2):
            p.observe_step(1, plain, 0, 0.0, plain)  # the next plain steps: as modelled
    assert p.switch_ms == pytest.approx(10.0, rel=1e-3)
    assert p.cost.step_ms(1, 0) == pytest.approx(plain, rel=1e-3)  # the plain steps' cost is untouched
    wider = p.probe_spacing(c)
    assert wider > spacing
    # the switch costs 10 ms more per probe: spaced by that over PROBE_BUDGET of a plain step more
    assert wider == pytest.approx(spacing + 10.0 / (PROBE_BUDGET * plain), abs=1.5)


def test_a_switch_is_measured_against_plain_steps_the_model_knows():
    # the cost model's plain overhead starts at 0 (optimistic) and learns from plain steps
    # outside a switch's steps; a warm-up that drafts every few steps measured its first
    # switch against that 0, so every step's overhead counted as switch (16 steps' worth:
    # 15.9 ms on the padded pair), and probes were spaced by it
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    plain = p.cost.step_ms(1, 0)
    wall = plain + 1.0  # a plain step: the modelled pass and 1 ms of overhead, no switch at all

    def drafting_step() -> None:
        p.observe_step(1 + MAX_DRAFT, p.cost.verify_ms(1 + MAX_DRAFT), 16, 0.2, p.cost.step_ms(1 + MAX_DRAFT, 16))

    drafting_step()
    for _ in range(SWITCH_STEPS):
        p.observe_step(1, plain, 0, 0.0, wall)
    assert p.switch_ms == 0.0  # not measured: the model had seen no plain step
    for _ in range(60):  # plain steps: the model learns their overhead
        p.observe_step(1, plain, 0, 0.0, wall)
    assert p.cost.step_ms(1, 0) == pytest.approx(wall, abs=0.01)
    drafting_step()
    for _ in range(SWITCH_STEPS):
        p.observe_step(1, plain, 0, 0.0, wall)
    assert p.switch_ms == pytest.approx(0.0, abs=0.2)


def test_the_switch_back_counts_against_drafting_in_the_realized_rates():
    # a lone sequence's realized rates: the plain step after a drafting one is slower by
    # the switch (llama.cpp's graph rebuild), which drafting caused; counted as a plain
    # step's time it would make plain steps look slower and drafting pay when it does not
    def run(switch: float) -> DraftPolicy:
        p, sts = policy(cost(0.5), acceptance=0.9)
        k = p.choose(sts, [MAX_DRAFT], [0])[0]  # the prediction its steps are measured against
        assert k > 0
        plain = p.cost.step_ms(1, 0)
        for _ in range(30):
            # a drafting step: 5 tokens in 4 plain steps' time (1.25x the plain rate) ...
            p.observe_step(1 + k, p.cost.verify_ms(1 + k), 16, 0.2, 4 * plain)
            p.observe_lone(5, True, 4 * plain)
            # ... then the switch back: a plain step that takes ``switch`` plain steps' time
            p.observe_step(1, plain, 0, 0.0, switch * plain)
            p.observe_lone(1, False, switch * plain)
            for _ in range(3):
                p.observe_step(1, plain, 0, 0.0, plain)
                p.observe_lone(1, False, plain)
        assert p.plain_rate.value() == pytest.approx(1 / plain, rel=1e-3)  # the switch is not a plain step's
        # drafting: 5 tokens per 4 + (switch - 1) plain steps' time
        assert p.draft_rate.value() == pytest.approx(5 / ((3 + switch) * plain), rel=0.02)
        return p

    assert run(switch=3.0).drafting_loses()  # 5 per 6 plain steps' time; plain steps: 1 per 1
    assert not run(switch=1.0).drafting_loses()  # 5 per 4: it pays


def test_the_steps_slowed_after_a_switch_back_are_charged_to_probes():
    # on a small CPU model the plain steps after a drafting step stay slow for a while
    # (the drafter's pass evicted the target's weights from the caches: on the embedded
    # pair the next 20 took 1.4-15 ms more than plain steps, more than the first one's
    # graph rebuild): their excess is part of what a probe costs
    p = seasoned(DraftPolicy(cost(0.5), MAX_DRAFT))
    c = Choice([expected_tokens([0.3] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    plain = p.cost.step_ms(1, 0)
    spacing = p.probe_spacing(c)
    aftermath = [4.0, 2.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]  # 10 ms over 8 steps
    for _ in range(60):
        wall = p.cost.step_ms(1 + MAX_DRAFT, 16)
        p.observe_step(1 + MAX_DRAFT, p.cost.verify_ms(1 + MAX_DRAFT), 16, 0.2, wall)
        for extra in [*aftermath, *[0.0] * (SWITCH_STEPS + 4)]:
            p.observe_step(1, plain, 0, 0.0, plain + extra)
    assert p.switch_ms == pytest.approx(10.0, rel=0.02)
    assert p.cost.step_ms(1, 0) == pytest.approx(plain, rel=1e-3)  # the plain steps' cost is untouched
    assert p.probe_spacing(c) == pytest.approx(spacing + 10.0 / (PROBE_BUDGET * plain), abs=2)
    # a switch cut short by the next drafting step is not measured
    p.observe_step(1 + MAX_DRAFT, p.cost.verify_ms(1 + MAX_DRAFT), 16, 0.2, wall)
    p.observe_step(1, plain, 0, 0.0, plain + 50.0)
    p.observe_step(1 + MAX_DRAFT, p.cost.verify_ms(1 + MAX_DRAFT), 16, 0.2, wall)
    assert p.switch_ms == pytest.approx(10.0, rel=0.02)


def test_a_vetoed_sequence_skips_its_weighings_until_the_rates_change():
    # drafting realized less than plain steps: a weighing could not turn it on, so the
    # due ones are skipped (the choice costs ~70 us of Python in the engine, 7% of a
    # plain step of the embedded target); once the rates say drafting pays, the next
    # due weighing happens and drafting resumes
    p, sts = policy(cost(0.05), acceptance=0.8)
    st = sts[0]
    assert p.choose(sts, [MAX_DRAFT], [0])[0] > 0
    for _ in range(10):
        p.observe_lone(1, False, 1.0)
        p.observe_lone(4, True, 5.0)
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
    weighed = 0
    for _ in range(40):
        if not p.skip(st):  # only where a probe is due (it may find the spacing too short)
            k = p.choose(sts, [MAX_DRAFT], [0])[0]
            assert k == 0 or (k == MAX_DRAFT and st.probing)
            weighed += 1
    assert weighed <= 6  # probes after 4, 8 and 16 steps off (not every RECHECK steps: 10)
    for _ in range(40):  # plain steps slow down (a busy machine): drafting now realizes more
        p.observe_lone(1, False, 10.0)
    assert not p.drafting_loses()
    due = next(i for i in range(RECHECK + 1) if not p.skip(st))
    assert due <= RECHECK and p.choose(sts, [MAX_DRAFT], [0])[0] > 0


def test_probes_are_spaced_by_the_time_they_measured():
    # a lone probe injects the rows its sequence deferred while off and makes llama.cpp
    # rebuild its graphs: it takes longer than the model's drafting step of a run, and
    # that measured time is what it costs against plain steps
    p = seasoned(DraftPolicy(cost(0.5), MAX_DRAFT))
    c = Choice([expected_tokens([0.3] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    plain = p.cost.step_ms(1, 0)
    modelled = p.cost.step_ms(1 + MAX_DRAFT, 1 + MAX_DRAFT)
    spacing = p.probe_spacing(c)
    p.observe_lone(2, True, modelled / 2, probe=True)  # faster than modelled: the model stays the floor
    assert p.probe_spacing(c) == spacing
    for _ in range(30):
        p.observe_lone(2, True, modelled + 20.0, probe=True)
    assert p.probe_ms == pytest.approx(modelled + 20.0, rel=1e-3)
    # 20 ms more per probe: spaced by that over PROBE_BUDGET of a plain step more
    assert p.probe_spacing(c) == pytest.approx(spacing + 20.0 / (PROBE_BUDGET * plain), abs=1.5)
    p.observe_lone(2, True, 1000.0)  # a drafting step that is not a probe leaves it alone
    assert p.probe_ms == pytest.approx(modelled + 20.0, rel=1e-3)


def test_a_lone_sequence_that_always_drafts_still_measures_plain_steps():
    # the calibration ran at a noisy moment and put a plain pass at 6x its cost: the model
    # says drafting pays, and a sequence that never takes a plain step would never learn
    # otherwise (the realized rates need both kinds of step; a bench worker drafted a whole
    # run at 0.5x the target alone). Now and then it takes plain steps until they are known
    rows = list(range(1, 65))
    true = cost(1.0, draft_ms=2.0, verify_ms=1.0)  # r rows: r ms; a drafter pass: 2 ms
    wrong = CostModel(rows, [6.0 if r == 1 else true.verify_ms(r) for r in rows], rows, [2.0] * 64, 64)
    p, ks = run_lone(wrong, true)
    assert p.cost.step_ms(1, 0) == pytest.approx(1.0, rel=0.05)  # its plain steps taught the model
    assert p._realized() < 1.0  # and what drafting realized agrees: the model now keeps it off
    assert sum(1 for k in ks[-300:] if k) <= 12  # probes only
    # where drafting does pay (memory-bound: 3 tokens for 1.4 ms), the check costs a few plain steps
    true = cost(0.02, draft_ms=0.2, verify_ms=1.0)
    wrong = CostModel(rows, [6.0 if r == 1 else true.verify_ms(r) for r in rows], rows, [0.2] * 64, 64)
    p, ks = run_lone(wrong, true)
    assert not p.drafting_loses()
    assert ks.count(0) <= 12 and all(ks[-300:])


def run_lone(model: CostModel, true: CostModel) -> tuple[DraftPolicy, list[int]]:
    """600 steps of a lone sequence whose drafts keep two tokens, costed by ``true``."""
    p = DraftPolicy(model, MAX_DRAFT)
    st = p.new_sequence()
    ks = []
    for _ in range(600):
        k = p.choose([st], [MAX_DRAFT], [0])[0]
        ks.append(k)
        if k:  # two drafted tokens kept
            acc = min(k, 2)
            p.observe_sequence(st, k, acc)
            ms = true.step_ms(1 + k, 1 + k)
            p.observe_step(1 + k, true.verify_ms(1 + k), 1 + k, 2.0, ms)
            p.observe_lone(1 + acc, True, ms, probe=st.probing, k=k)
        else:
            ms = true.step_ms(1, 0)
            p.observe_step(1, ms, 0, 0.0, ms)
            p.observe_lone(1, False, ms)
    return p, ks


def test_sampled_plain_steps_keep_the_estimates_pace():
    # a lone sequence off between weighings is observed every PLAIN_SAMPLE-th plain step,
    # counted that many times: its rate and costs move as if every step had been observed
    # (observed less often they would lag a change of the machine's speed by that factor,
    # and a stale plain rate keeps drafting off). Exactly, but for the machine's speed:
    # the sampled step moves it once, at the kind's usual time as it stood before
    every = DraftPolicy(cost(0.5), MAX_DRAFT)
    sampled = DraftPolicy(cost(0.5), MAX_DRAFT)
    uncounted = DraftPolicy(cost(0.5), MAX_DRAFT)  # every PLAIN_SAMPLE-th step, counted once
    for wall in (10.0, 20.0):
        for _ in range(40):
            every.observe_step(1, wall - 1.0, 0, 0.0, wall)
            every.observe_lone(1, False, wall)
        for _ in range(40 // PLAIN_SAMPLE):
            sampled.observe_step(1, wall - 1.0, 0, 0.0, wall, times=PLAIN_SAMPLE)
            sampled.observe_lone(1, False, wall, times=PLAIN_SAMPLE)
            uncounted.observe_step(1, wall - 1.0, 0, 0.0, wall)
            uncounted.observe_lone(1, False, wall)
        exact = 1e-9 if wall == 10.0 else 0.02  # the speed moves once the wall time changes
        assert sampled.plain_rate.value() == pytest.approx(every.plain_rate.value(), rel=exact)
        assert sampled.plain_rate.n == pytest.approx(every.plain_rate.n, rel=1e-9)
        assert sampled.cost.step_ms(1, 0) == pytest.approx(every.cost.step_ms(1, 0), rel=exact)
        assert sampled.speed.value == pytest.approx(every.speed.value, rel=exact)
    assert every.speed.value > 1.2  # the change was the machine's (to the speed first) ...
    assert uncounted.plain_rate.value() < 0.9 * every.plain_rate.value()  # ... and counted once, it lags
    # the engine's path: observe_plain counts each sampled step PLAIN_SAMPLE times
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    for _ in range(40):
        p.observe_plain(19.0, 20.0)
    assert p.plain_rate.n == pytest.approx(sum(RATE_DECAY**i for i in range(40)), rel=1e-9)  # 40 steps' weight


def test_a_new_sequence_starts_from_the_pairs_estimate_of_each_position():
    # on the padded embedded pair the first drafted token is kept about half the time and
    # the later ones, once the first was, nearly always (0.57, 0.89, 0.97, ...): a new
    # generation's prior for each position is the pair's estimate of that position, not
    # the first position's carried along the block (which made new generations draft short)
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    st = p.new_sequence()
    for i in range(400):
        kept = 0 if i % 2 else MAX_DRAFT  # position 1 kept half the time, the rest always after it
        p.observe_sequence(st, MAX_DRAFT, kept)
    pooled = p.pooled.conditional()
    assert pooled[0] == pytest.approx(0.5, abs=0.05) and min(pooled[1:]) > 0.9
    new = p.new_sequence()
    assert new.acceptance.conditional() == pytest.approx(pooled)
    # its own steps then weigh against those priors, position by position
    new_seq_c = new.acceptance.conditional()
    p.observe_sequence(new, MAX_DRAFT, 0)
    after = new.acceptance.conditional()
    assert after[0] < new_seq_c[0] and after[1:] == pytest.approx(new_seq_c[1:], rel=0.02)


def test_positions_no_draft_reaches_return_to_their_prior():
    # a stretch of low acceptance at the end of a block left the pair's estimate of
    # position 2 low; drafts of one token never try it again: without fading it would
    # keep every draft at one token for good (seen on the padded pair: 470 of 864 steps
    # drafted one where four paid 19% more)
    p = DraftPolicy(cost(0.05), MAX_DRAFT)
    st = p.new_sequence()
    for _ in range(30):
        p.observe_sequence(st, MAX_DRAFT, 1)  # position 1 kept, position 2 rejected
    low = p.pooled.conditional()[1]
    assert low < 0.2
    for _ in range(300):
        p.observe_sequence(st, 1, 1)  # one-token drafts, kept: position 2 is not tried
    c = p.pooled.conditional()
    assert c[1] > 0.8 and c[1] == pytest.approx(c[0], abs=0.1)  # back to its prior, position 1's estimate
    assert st.acceptance.conditional()[1] > 0.8


def test_a_rejected_first_position_does_not_shorten_a_new_pairs_drafts():
    # memory-bound, as the demo's padded target: 8 rows cost 1.6x one. A new pair's first
    # draft is rejected at its first position (a generation's first steps are often its
    # worst). That says nothing of the positions after it: they keep the prior, and the
    # pair drafts on, half the block and more (before, they took the first's fallen estimate,
    # the next draft was one token, and after its rejection the pair went off for 20 steps)
    rows = list(range(1, 9))
    c = CostModel(rows, [12, 13.2, 14.8, 15.9, 16.5, 17.3, 18.5, 19.3], rows, [1.5] * 8, 8)
    p = DraftPolicy(c, 7, pass_rows=8)
    st = p.new_sequence()
    k = p.choose([st], [7], [0])[0]
    assert k > 0
    p.observe_sequence(st, k, 0)
    assert st.acceptance.conditional()[0] < 0.5
    assert st.acceptance.conditional()[1:] == pytest.approx([0.6] * 6)
    assert p.choose([st], [7], [0])[0] >= 4
    # many rejections: off (probes go on)
    for _ in range(30):
        p.observe_sequence(st, 7, 0)
    assert p.choose([st], [7], [0]) == [0]


def test_a_sequence_that_keeps_less_past_the_first_position_expects_less_further_along():
    # the pair's estimate of a block's later positions comes from the sequences that
    # reach them, whose drafts keep most (here every draft past the first position is
    # kept whole): a sequence whose drafts stop at its second position reaches the later
    # ones rarely, and their priors are scaled down by its share of the pair's estimate
    # of the second. Replayed on the bench's prompts with the padded pair's costs, the
    # adaptive engine had drafted past what a prompt's drafts keep
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    pair = p.new_sequence()
    for i in range(400):
        p.observe_sequence(pair, MAX_DRAFT, 0 if i % 2 else MAX_DRAFT)
    pooled = p.pooled.conditional()
    assert pooled[0] == pytest.approx(0.5, abs=0.05) and min(pooled[1:]) > 0.9
    st = p.new_sequence()
    for _ in range(6):
        p.observe_sequence(st, MAX_DRAFT, 1)  # the first position kept, the second rejected
    c, flat = st.acceptance.conditional(pooled), st.acceptance.conditional(pooled, along=False)
    share = c[1] / pooled[1]
    assert c[0] > pooled[0] and share < 0.5
    assert c[2] == pytest.approx(pooled[2] * share) and c[2:] == pytest.approx([x * share for x in pooled[2:]])
    assert flat[2:] == pytest.approx(pooled[2:])  # without the scaling: the pair's, untried
    # the first position's rejections alone leave the later positions' priors as they were
    first = p.new_sequence()
    for _ in range(6):
        p.observe_sequence(first, MAX_DRAFT, 0)
    assert first.acceptance.conditional(pooled)[1:] == pytest.approx(pooled[1:])
    # a sequence that keeps more than the pair is not scaled up
    good = p.new_sequence()
    for _ in range(6):
        p.observe_sequence(good, 2, 2)
    assert good.acceptance.conditional(pooled)[2:] == pytest.approx(pooled[2:])


def test_the_estimate_without_scaling_bounds_the_one_with_it_while_off():
    # DraftPolicy._settled takes the higher of the sequence's estimate without the scaling
    # and the pair's as the most that its drift while off can reach: so it must be
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    for n in range(300):
        p.observe_sequence(p.new_sequence(), MAX_DRAFT, (n * 5) % (MAX_DRAFT + 1))
    pooled = p.pooled.conditional()
    for seed in range(41):
        st = p.new_sequence()
        for j in range(seed % 9 + 1):
            k = 1 + (seed * 3 + j) % MAX_DRAFT
            st.acceptance.observe(k, (seed + j * j) % (k + 1))
        if seed == 40:  # the second position mostly rejected, the later ones kept where tried
            for j in range(12):
                st.acceptance.observe(MAX_DRAFT, MAX_DRAFT if j == 11 else 1)
        high = [max(a, b) for a, b in zip(st.acceptance.conditional(pooled, along=False), pooled, strict=True)]
        for _ in range(60):
            st.acceptance.forget()
            assert all(c <= h + 1e-12 for c, h in zip(st.acceptance.conditional(pooled), high, strict=True))


def kept(n: int, c: float, k: int) -> int:
    """Tokens the ``n``-th draft, of ``k``, keeps when each position is kept with
    conditional rate ``c``: a deterministic mix over 20 drafts (geometric quantiles)."""
    return geometric_run((n * 7) % 20, c, k)


def test_probes_of_the_whole_block_do_not_stop_a_shorter_draft_that_pays():
    # a memory-bound target whose passes grow with rows (8 rows: 1.9x one) and a drafter
    # whose tokens are kept half the time: drafting 2 gives 1.27x the plain rate, a probe of
    # the whole block about 1.0x. After a stretch where nothing is kept (off, probes only),
    # the acceptance recovers. Before, the probes' realized rate (the block's, at a loss
    # then, at par now) stood for drafting's and vetoed the shorter draft the model chose:
    # the padded pair stayed off through several prose prompts where fixed draft_max 2 gave
    # 1.3-1.7x the target alone. Now probes stay out of that rate, and one that beats plain
    # steps restarts it (the next drafts measure it anew)
    rows = list(range(1, 9))
    verify = [12.0 + 1.5 * (r - 1) for r in rows]
    true = CostModel(rows, verify, rows, [1.5] * 8, 8)
    p = DraftPolicy(CostModel(rows, verify, rows, [1.5] * 8, 8), 7, pass_rows=8)
    st = p.new_sequence()
    plain_ms = true.step_ms(1, 0)
    tokens, ms, drafts = [], [], 0
    for step in range(1500):
        c = 0.0 if step < 500 else 0.5
        k = p.choose([st], [7], [0])[0]
        if k:
            a, drafts = kept(drafts, c, k), drafts + 1
            p.observe_sequence(st, k, a)
            wall = true.step_ms(1 + k, 8)
            p.observe_step(1 + k, true.verify_ms(1 + k), 8, 1.5, wall)
            p.observe_lone(1 + a, True, wall, probe=st.probing)
        else:
            wall, a = plain_ms, 0
            p.observe_step(1, plain_ms, 0, 0.0, plain_ms)
            p.observe_lone(1, False, plain_ms)
        tokens.append(1 + a)
        ms.append(wall)
    assert sum(tokens[300:500]) / sum(ms[300:500]) < 1.02 / plain_ms  # off while nothing is kept
    drafting = sum(1 for t in ms[1000:] if t > plain_ms)
    assert drafting > 400  # of 500
    assert sum(tokens[1000:]) / sum(ms[1000:]) > 1.15 / plain_ms


def test_a_probe_that_a_shorter_draft_would_have_won_with_restarts_the_drafting_rate():
    # a probe drafts the whole block; on a target whose passes grow with rows it can lose
    # to plain steps where a short draft of the same outcome pays (on the padded pair a
    # probe took about 2 plain steps' time). Its outcome stands for every
    # length up to its own: a draft of 1 would have kept that token in 1.3 plain steps'
    # time, so the rates that keep drafting off are stale
    rows = list(range(1, 9))
    verify = [12.0 + 1.5 * (r - 1) for r in rows]

    def vetoed() -> DraftPolicy:
        p = DraftPolicy(CostModel(rows, verify, rows, [1.5] * 8, 8), 7, pass_rows=8)
        for _ in range(10):
            p.observe_lone(1, False, 12.0)  # plain steps: 1 token per 12 ms
            # drafting steps of 1 that kept it, in 2.5 plain steps' time (the model's 15 ms would pay)
            p.observe_lone(2, True, 30.0, k=1)
        assert p.drafting_loses()
        return p

    probe_ms = 25.0  # the model's 24 ms for 8 rows and a drafter pass, and 1 ms of one-off costs
    p = vetoed()
    p.observe_lone(2, True, probe_ms, probe=True, k=7)  # kept 1: 2 tokens in 25 ms lose to 2 plain steps
    assert not p.drafting_loses()  # ... a draft of 1 would have given them in 15.6 ms
    p = vetoed()
    p.observe_lone(1, True, probe_ms, probe=True, k=7)  # kept nothing: no length would have paid
    assert p.drafting_loses()


def run_as_skips(p: DraftPolicy, st, n_max: int) -> int:
    """``p.plain_run(st, n_max)``, checked against the skips it stands for (on copies)."""
    ref_p, ref_st = copy.deepcopy((p, st))
    n = p.plain_run(st, n_max)
    skips = 0
    while skips < n_max and ref_p.skip(ref_st):
        skips += 1
    assert n == skips
    assert (st.off_steps, st.unforgotten) == (ref_st.off_steps, ref_st.unforgotten)
    return n


def test_a_run_of_plain_steps_is_the_skips_it_stands_for(monkeypatch):
    # a lone sequence that is off takes its plain steps in runs (one call to the core,
    # Engine._step_run): a run is the skips it replaces and ends before the next weighing
    unsettle(monkeypatch)
    p, sts = policy(cost(0.5), acceptance=0.02)
    sts[0].spacing = 10**6  # no probes
    p.timer = lambda: 0.0  # weighings take no time: they recheck every RECHECK steps
    while p.choose(sts, [MAX_DRAFT], [0]) != [0]:
        pass
    for _ in range(SWITCH_STEPS):  # past the switch of sizes after the drafting steps
        p.observe_step(1, 10.0, 0, 0.0, 10.5)
    p.recheck = 20
    for n_max in (1, 7, 100):
        assert 1 <= run_as_skips(p, sts[0], n_max) <= n_max
    assert sts[0].off_steps % p.recheck == 0 and p.plain_run(sts[0], 100) == 0  # this one is weighed
    assert p.choose(sts, [MAX_DRAFT], [0]) == [0]
    # a switch's steps go in runs too (observe_plain_run takes them one by one)
    p._after = 0
    settled, ref = copy.deepcopy((p, sts[0]))
    settled._after = SWITCH_STEPS
    assert run_as_skips(p, sts[0], 100) == settled.plain_run(ref, 100) > 1
    p._after = SWITCH_STEPS
    # where drafting realized less than plain steps (a veto), the due weighings are
    # skipped: a run goes past them, as the skips would
    for _ in range(10):
        p.observe_lone(1, False, 1.0)
        p.observe_lone(2, True, 5.0)
    assert p.drafting_loses()
    assert [run_as_skips(p, sts[0], n_max) for n_max in (1, 7, 100)] == [1, 7, 100]


def test_a_runs_observation_is_its_steps_observed_one_by_one():
    a = DraftPolicy(cost(0.5), MAX_DRAFT)
    b = DraftPolicy(cost(0.5), MAX_DRAFT)
    for p in (a, b):
        p._after = SWITCH_STEPS
    a.observe_plain_run([11.0] * 30, [12.0] * 30)
    for _ in range(30):
        b.observe_step(1, 11.0, 0, 0.0, 12.0)
        b.observe_lone(1, False, 12.0)
    assert a.cost.step_ms(1, 0) == pytest.approx(b.cost.step_ms(1, 0), rel=1e-9)
    assert a.plain_rate.value() == pytest.approx(b.plain_rate.value(), rel=1e-9)
    assert a.plain_rate.n == pytest.approx(b.plain_rate.n, rel=1e-9)


def test_a_runs_switch_steps_are_observed_one_by_one():
    # the plain steps after a drafting step measure the switch (their excess over a plain
    # step): in a run they are observed each by its own time, as if taken one at a time
    a = DraftPolicy(cost(0.5), MAX_DRAFT)
    for _ in range(SWITCH_STEPS):  # the model has seen plain steps: a switch is measured
        a.observe_step(1, 10.0, 0, 0.0, 10.5)
    a.observe_step(1 + MAX_DRAFT, 30.0, MAX_DRAFT + 1, 8.0, 40.0)  # a drafting step
    b = copy.deepcopy(a)
    verify = [14.0, 12.0, 11.0] + [10.0] * 27
    wall = [v + 0.5 for v in verify]
    a.observe_plain_run(verify, wall)
    for v, w in zip(verify, wall, strict=True):
        b.observe_step(1, v, 0, 0.0, w)
        b.observe_lone(1, False, w)
    assert a.switch_ms == b.switch_ms > 0  # the same switch, measured step by step
    assert a._after == b._after == SWITCH_STEPS
    assert a.plain_rate.n == pytest.approx(b.plain_rate.n, rel=1e-9)
    assert a.cost.step_ms(1, 0) == pytest.approx(b.cost.step_ms(1, 0), rel=1e-9)
    # a mean over the whole run would have counted the switch's excess as plain steps' cost
    c = copy.deepcopy(b)
    c.observe_step(1, sum(verify) / 30, 0, 0.0, sum(wall) / 30, 30)
    assert c.cost.step_ms(1, 0) != pytest.approx(a.cost.step_ms(1, 0), rel=1e-3)


def test_the_steps_after_a_prompts_prefill_say_nothing_of_their_kinds_costs():
    # llama.cpp rebuilds the target's graph for one row after a prompt's batch: on the
    # embedded target a generation's first plain step took 1.9x the usual, the next two
    # 1.14x and 1.04x. Counted as plain steps, a 4-token generation before each timed one
    # (the bench's rewarm) put the machine's speed at 1.2-1.4, and the pair drafted more
    # often (in 15 against 9 of 40 generations)
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    for _ in range(2 * SWITCH_STEPS + SPEED_GATE):  # the usual plain step: 10 ms
        p.observe_step(1, 10.0, 0, 0.0, 10.0)
        p.observe_lone(1, False, 10.0)
    before = (p.speed.value, p.plain_rate.value(), p.plain_rate.n, p.cost.step_ms(1, 0))
    assert before[:2] == pytest.approx((1.0, 0.1))
    slow = [19.0, 11.4, 10.4][:PREFILL_STEPS]
    p.prefilled()  # a generation's first steps one at a time (weighings) ...
    for w in slow:
        p.observe_step(1, w, 0, 0.0, w)
        p.observe_lone(1, False, w)
    assert (p.speed.value, p.plain_rate.value(), p.plain_rate.n, p.cost.step_ms(1, 0)) == before
    p.prefilled()  # ... or in a run
    p.observe_plain_run(slow, slow)
    assert (p.speed.value, p.plain_rate.value(), p.plain_rate.n, p.cost.step_ms(1, 0)) == before
    q = copy.deepcopy(p)
    # the steps after them are plain steps as before
    p.observe_plain_run([10.0, 20.0], [10.0, 20.0])
    assert p.plain_rate.n > before[2] and p.plain_rate.value() < 0.1
    # a drafting step among them still starts a switch (the plain steps after it measure
    # it, those of the prefill's aside); its time is not a probe's either
    q.prefilled()
    q.observe_step(1 + MAX_DRAFT, 30.0, MAX_DRAFT + 1, 8.0, 40.0)
    q.observe_lone(3, True, 40.0, probe=True, k=MAX_DRAFT)
    assert q.probe_ms == 0.0
    walls = [10.0] * (PREFILL_STEPS - 1) + [14.0] + [10.0] * (SWITCH_STEPS - 1)
    q.observe_plain_run(walls, walls)
    assert q.switch_ms == pytest.approx(4.0)


def test_probes_spend_in_proportion_to_what_they_could_find():
    # where even a whole block kept saves little (a compute-bound target: the embedded
    # pair's model said 33-52% on this CPU), a probe can find little: probes get
    # PROBE_BUDGET in proportion to that share of the time, all of it from PROBE_ROOM up
    # (replayed, the embedded pair gained 0-0.5%; the padded one, whose block saves 71%,
    # drafted exactly as before)
    for per_row, room, acceptance in ((7.0, 1.0 - 115.0 / 160.0, 0.95), (2.0, 1.0 - 40.0 / 160.0, 0.5)):
        c = Choice([expected_tokens([acceptance] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
        p = seasoned(DraftPolicy(cost(per_row, draft_ms=0.0), MAX_DRAFT))
        block = p.cost.step_ms(1 + MAX_DRAFT, 1 + MAX_DRAFT)
        assert 1.0 - block / 160.0 == pytest.approx(room)
        budget = PROBE_BUDGET * min(room / PROBE_ROOM, 1.0)
        spacing = p.probe_spacing(c)
        assert 0 < spacing == math.ceil((block - c.gains[MAX_DRAFT] * 10.0) / (budget * 10.0)) < PROBE_WAIT_MAX
    assert room >= PROBE_ROOM  # the second: the whole budget
    # a block that saves nothing, however likely kept (the whole budget: 115 steps), waits longest
    c = Choice([expected_tokens([0.99] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    assert DraftPolicy(cost(10.0, draft_ms=0.0), MAX_DRAFT).probe_spacing(c) == PROBE_WAIT_MAX


def test_probes_spend_by_the_room_their_measured_time_leaves():
    # the calibration times passes on an empty slot with warm caches: on the embedded pair
    # it put a whole block at 1.1 ms where probes took 3.7 (8 plain steps: 3.1), and its
    # probes came every 200-1,700 steps for the ~40 generations the model took to learn
    # that a block kept saves nothing. A probe's measured time bounds what a whole block
    # kept could save, as it bounds the probe's loss
    c = Choice([expected_tokens([0.5] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    p = seasoned(DraftPolicy(cost(2.0, draft_ms=0.0), MAX_DRAFT))  # a block: 40 ms, 16 plain steps 160
    plain = p.cost.step_ms(1, 0)
    # the model's room, 0.75: the whole budget
    assert p.probe_spacing(c) == math.ceil((40.0 - c.gains[MAX_DRAFT] * plain) / (PROBE_BUDGET * plain))
    p.observe_lone(2, True, 100.0, probe=True, k=MAX_DRAFT)  # room 1 - 100 / 160: 3/4 of the budget
    loss = 100.0 - c.gains[MAX_DRAFT] * plain
    budget = PROBE_BUDGET * (1.0 - 100.0 / 160.0) / PROBE_ROOM
    assert p.probe_spacing(c) == math.ceil(loss / (budget * plain)) > math.ceil(loss / (PROBE_BUDGET * plain))
    p.observe_lone(2, True, 100.0 + 70.0 / PROBE_ALPHA, probe=True, k=MAX_DRAFT)  # now 170: no room
    assert p.probe_ms == pytest.approx(170.0)
    assert p.probe_spacing(c) == PROBE_WAIT_MAX


def test_a_new_pairs_probes_follow_the_doubling_wait_until_it_has_news():
    # a new pair's first drafts come at a generation's first positions, where drafters keep
    # least (the shipped pair kept nothing for 3-11 steps, then most blocks whole): budgeted
    # at an estimate from those alone, its probes came 63-72 steps apart, and the demo's
    # first prompt read 0.99-1.32x the target alone in 14 of 24 processes. Until PROBE_NEWS
    # drafting steps, probes follow the doubling wait alone where a block could save much
    c = Choice([expected_tokens([0.2] * MAX_DRAFT, k) for k in range(MAX_DRAFT + 1)], 0, MAX_DRAFT)
    p = DraftPolicy(cost(0.5), MAX_DRAFT)  # memory-bound: a block, 17.7 ms, saves 1 - 17.7 / 160
    st = p.new_sequence()
    for _ in range(PROBE_NEWS):
        assert p.probe_spacing(c) == 0
        p.observe_sequence(st, MAX_DRAFT, 0)
    plain = p.cost.step_ms(1, 0)
    block = p.cost.step_ms(1 + MAX_DRAFT, 1 + MAX_DRAFT)
    assert p.probe_spacing(c) == math.ceil((block - c.gains[MAX_DRAFT] * plain) / (PROBE_BUDGET * plain)) > 0
    # off from its first step (its drafts keep nothing), a new pair probes on the doubling
    # wait: PROBE_FIRST steps off, then twice as many after each probe, up to PROBE_MAX
    p = DraftPolicy(cost(2.0, draft_ms=0.0), MAX_DRAFT)  # a block: 40 ms, 16 plain steps 160
    st = p.new_sequence()
    st.acceptance.observe(MAX_DRAFT, 0, 30.0)
    probes, step = [], 0
    while p.news < PROBE_NEWS:
        k = p.choose([st], [MAX_DRAFT], [0])[0]
        if st.probing:
            probes.append(step)
        if k:
            p.observe_sequence(st, k, 0)
        step += 1
    assert probes[:3] == [PROBE_FIRST - 1, 3 * PROBE_FIRST - 1, 7 * PROBE_FIRST - 1]
    assert max(b - a for a, b in zip(probes, probes[1:], strict=False)) == PROBE_MAX
    # then (as for a seasoned pair) the budget spaces them: at these estimates ~300 steps apart
    c = Choice(expected_gains(st.acceptance.conditional(), MAX_DRAFT), 0, MAX_DRAFT)
    assert p.probe_spacing(c) > 4 * PROBE_MAX
    # where a block kept saves little (a compute-bound target), the budget spaces them from the start
    assert DraftPolicy(cost(7.0, draft_ms=0.0), MAX_DRAFT).probe_spacing(c) > 0


def test_a_generation_after_a_settled_one_starts_settled_until_news():
    # its prompt's features may then wait for the drafter's next pass (Engine._start)
    p = DraftPolicy(cost(10.0), MAX_DRAFT)  # drafting cannot pay: every weighing settles
    st = p.new_sequence()
    assert not p.starts_settled(st)  # the first generation: nothing weighed yet
    assert p.choose([st], [MAX_DRAFT], [0]) == [0]
    p.end_sequence(st)
    nxt = p.new_sequence()
    assert p.starts_settled(nxt)
    p.end_sequence(nxt)
    p.observe_sequence(p.new_sequence(), MAX_DRAFT, 3)  # news: the pair's estimate moved
    assert not p.starts_settled(p.new_sequence())


def test_a_sequence_whose_drafts_the_confidence_cut_empties_stops_drafting():
    # a draft the cut ends before its first token verifies nothing and gives no news of
    # acceptance, yet its drafter pass cost time: counted as no news at all, the policy
    # would go on asking for drafts the cut empties (a drafter pass: a fifth of a plain step)
    p = DraftPolicy(cost(0.5, draft_ms=2.0), MAX_DRAFT, cut=0.3)
    st = p.new_sequence()
    drafted = []  # per step: it asked for a draft, not as a probe
    for _ in range(80):
        k = p.choose([st], [MAX_DRAFT], [0])[0]
        drafted.append(k > 0 and not st.probing)
        if k:
            p.observe_sequence(st, 0, 0, k)
    assert drafted[0]  # at the pair's prior it drafted
    assert sum(drafted[10:]) <= 3  # then probes, and a rare weighing as its estimate drifts back


def test_a_draft_the_confidence_cut_shortens_is_priced_at_the_rows_it_leaves():
    # a row costs 6 ms on a 10 ms pass: a draft of 1 that keeps 1.5 tokens on average
    # loses over its 2 rows, and pays where the cut leaves it half the time (1.5 rows):
    # half the drafts the cut ends before their token, the others keep it
    cut, rejected = DraftPolicy(cost(6.0), MAX_DRAFT, cut=0.3), DraftPolicy(cost(6.0), MAX_DRAFT)
    a, b = cut.new_sequence(), rejected.new_sequence()
    for i in range(40):
        cut.observe_sequence(a, i % 2, i % 2, 1)
        rejected.observe_sequence(b, 1, i % 2, 1)  # the same tokens kept, every draft verified
    assert cut.choose([a], [1], [0]) == [1]
    assert rejected.choose([b], [1], [0]) == [0]


def test_a_step_of_an_expected_row_count_costs_between_the_whole_counts_about_it():
    c = cost(0.5)
    assert c.step_ms(2.5, 0) == pytest.approx((c.step_ms(2, 0) + c.step_ms(3, 0)) / 2)
    assert c.step_ms(3.0, 4) == c.step_ms(3, 4)
