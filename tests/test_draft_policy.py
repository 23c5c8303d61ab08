"""The draft-length policy on synthetic machines whose answer is known, judged by
outcomes: the speed it reaches against the target alone and fixed lengths, not its
fields. Each machine is a cost table (ms of a target pass by rows, of a drafter
pass) and per-position acceptance; the policy sees only ``choose`` and ``observe``."""

from __future__ import annotations

import random

import pytest

from pydflash.draft_length import CostModel, DraftPolicy, MachineSpeed, Outcome
from pydflash.draft_length.policy import PROBE_BUDGET

BLOCK = 8
K = BLOCK - 1


class Machine:
    """Step times by rows (a target pass per row count, a drafter pass per block), and
    a draft's kept tokens drawn from per-position acceptance ``c``."""

    def __init__(self, verify: list[float], draft: float, c: list[float], seed: int = 0):
        self.verify, self.draft, self.c = verify, draft, c
        self.rng = random.Random(seed)

    def cost(self) -> CostModel:
        rows = list(range(1, len(self.verify)))
        return CostModel(rows, self.verify[1:], [BLOCK], [self.draft], len(self.verify) - 1)

    def kept(self, k: int) -> int:
        n = 0
        while n < k and self.rng.random() < self.c[n]:
            n += 1
        return n

    def step_ms(self, rows: int, drafting: bool) -> float:
        """One target pass over ``rows`` and, where any sequence drafts, one drafter pass."""
        return self.verify[min(rows, len(self.verify) - 1)] + self.draft * drafting


def run(m: Machine, tokens: int, fixed: int | None = None, n_seq: int = 1, policy: DraftPolicy | None = None):
    """Time to generate ``tokens`` per sequence, ``n_seq`` sequences stepping together,
    each step's length the policy's (``fixed``: that length). Returns (ms, lengths chosen)."""
    pol = policy or DraftPolicy(m.cost(), K, BLOCK)
    seqs = [pol.new_sequence() for _ in range(n_seq)]
    done = [0] * n_seq
    total, lengths = 0.0, []
    while min(done) < tokens:
        caps = [min(K, tokens - d - 1) for d in done]
        ks = [min(fixed, c) for c in caps] if fixed is not None else pol.choose(seqs, caps, [0] * n_seq)
        lengths += ks
        kept = [m.kept(k) for k in ks]
        rows = sum(1 + k for k in ks)
        ms = m.step_ms(rows, any(ks))
        total += ms
        done = [d + a + 1 for d, a in zip(done, kept, strict=True)]
        if fixed is None:
            out = [Outcome(k, k, a) for k, a in zip(ks, kept, strict=True)]
            verify = m.verify[min(rows, len(m.verify) - 1)]
            pol.observe(seqs, out, verify, m.draft if any(ks) else 0.0, ms)
    return total, lengths


MEMORY_BOUND = [0.0] + [10.0 + 0.3 * r for r in range(1, 65)]  # a pass costs about the same for any few rows
COMPUTE_BOUND = [0.0] + [10.0 * r for r in range(1, 65)]  # every row costs a whole pass


def test_where_drafting_pays_the_policy_drafts_and_beats_the_target_and_the_worst_fixed_length():
    m = Machine(MEMORY_BOUND, 2.0, [0.8] * K)
    adaptive, lengths = run(m, 2000)
    alone, _ = run(Machine(MEMORY_BOUND, 2.0, [0.8] * K), 2000, fixed=0)
    fixed = [run(Machine(MEMORY_BOUND, 2.0, [0.8] * K, seed=1), 2000, fixed=k)[0] for k in range(1, BLOCK)]
    assert alone / adaptive > 2.0
    assert adaptive < max(fixed)
    assert min(fixed) / adaptive > 0.95  # near the best fixed length
    assert sum(k > 0 for k in lengths) > 0.9 * len(lengths)


def test_where_drafting_cannot_pay_the_policy_turns_it_off_within_a_few_percent_of_the_target():
    m = Machine(COMPUTE_BOUND, 5.0, [0.5] * K)
    adaptive, lengths = run(m, 3000)
    alone, _ = run(m, 3000, fixed=0)
    assert alone / adaptive > 0.97
    # off; and no probes, where even a whole block kept would cost more than its tokens plainly
    assert sum(k == 0 for k in lengths) > 0.99 * len(lengths)


def test_acceptance_that_falls_turns_drafting_off_and_probes_cost_at_most_their_budget():
    # a drafter that was right (its prior) and then never is: off, and the probes that
    # look for its return lose no more than PROBE_BUDGET of the plain steps' time
    m = Machine(MEMORY_BOUND, 2.0, [0.0] * K)
    pol = DraftPolicy(m.cost(), K, BLOCK)
    run(m, 200, policy=pol)  # it learns
    adaptive, lengths = run(m, 5000, policy=pol)
    alone, _ = run(m, 5000, fixed=0)
    assert adaptive / alone - 1.0 <= PROBE_BUDGET * 1.5
    assert 0 < sum(k > 0 for k in lengths) < 0.05 * len(lengths)  # off, but it still probes


def test_a_drafter_that_recovers_is_found_again_by_probes():
    m = Machine(MEMORY_BOUND, 2.0, [0.0] * K)
    pol = DraftPolicy(m.cost(), K, BLOCK)
    run(m, 300, policy=pol)
    m.c = [0.9] * K
    _, lengths = run(m, 3000, policy=pol)
    assert sum(k > 0 for k in lengths[-100:]) > 90


def test_a_busy_batch_drafts_less_than_one_sequence_and_no_worse_than_any_common_fixed_length():
    # a pass is memory-bound up to 16 rows, then every row costs: one sequence drafts
    # whole blocks, eight sharing a step draft less each
    table = [0.0] + [10.0 + 0.2 * r if r <= 16 else 13.2 + 2.0 * (r - 16) for r in range(1, 129)]
    _, alone = run(Machine(table, 2.0, [0.7] * K), 600)
    t8, busy = run(Machine(table, 2.0, [0.7] * K), 600, n_seq=8)
    assert sum(busy) / len(busy) < 0.5 * sum(alone) / len(alone)
    fixed = [run(Machine(table, 2.0, [0.7] * K, seed=2), 600, fixed=k, n_seq=8)[0] for k in range(BLOCK)]
    assert min(fixed) / t8 > 0.95


def learnt(table: list[float], draft: float, c: list[float], n_seq: int) -> tuple[Machine, DraftPolicy]:
    """A machine and a policy that has run ``n_seq`` sequences on it for a while."""
    m = Machine(table, draft, c)
    pol = DraftPolicy(m.cost(), K, BLOCK)
    run(m, 100, n_seq=n_seq, policy=pol)
    return m, pol


def drafting_per_step(lengths: list[int], n_seq: int) -> list[int]:
    """How many of ``n_seq`` sequences drafted, step by step (``run``'s lengths)."""
    return [sum(k > 0 for k in lengths[i : i + n_seq]) for i in range(0, len(lengths), n_seq)]


def test_a_busy_batch_where_drafting_cannot_pay_probes_within_the_budget():
    # sixteen sequences whose drafter is right, on a machine where every row costs and a
    # drafter pass costs more than any draft saves: off, and the probes (of the batch, not
    # of each sequence) lose no more than PROBE_BUDGET of the plain steps' time
    m, pol = learnt([0.0] + [10.0 + 1.0 * r for r in range(1, 129)], 40.0, [0.9] * K, 16)
    adaptive, lengths = run(m, 1000, n_seq=16, policy=pol)
    alone, _ = run(m, 1000, fixed=0, n_seq=16)
    assert adaptive / alone - 1.0 <= PROBE_BUDGET * 1.5
    assert sum(k > 0 for k in lengths) < 0.01 * len(lengths)


def test_a_busy_batch_probes_one_sequence_at_a_time_and_finds_a_drafter_that_recovers():
    # drafting pays on this machine once the drafter is right again; eight sequences that
    # learnt it was wrong find that out through probes, one sequence's at a time
    m, pol = learnt([0.0] + [10.0 + 0.3 * r for r in range(1, 129)], 2.0, [0.0] * K, 8)
    drafting = drafting_per_step(run(m, 300, n_seq=8, policy=pol)[1], 8)
    assert sum(drafting) > 0 and max(drafting) == 1
    m.c = [0.9] * K
    drafting = drafting_per_step(run(m, 2000, n_seq=8, policy=pol)[1], 8)
    found = drafting.index(8)  # then every sequence drafts, until sequences finish
    assert found < 0.5 * len(drafting) and sum(n == 8 for n in drafting[found : found + 100]) >= 95


def test_a_draft_min_is_a_floor_and_a_pinned_sequence_keeps_its_length():
    pol = DraftPolicy(Machine(MEMORY_BOUND, 2.0, [0.8] * K).cost(), K, BLOCK)
    ks = pol.choose([pol.new_sequence(), None], [K, 3], [5, 0])
    assert ks[1] == 3 and ks[0] in (0, 5, 6, 7)
    ks = pol.choose([pol.new_sequence()], [2], [0])
    assert ks[0] <= 2


def test_drafts_the_confidence_cut_shortens_are_priced_at_the_rows_they_leave():
    # drafts of at least 3 (draft_min) that the cut ends after 2 tokens, the first kept:
    # 3 rows for 2 tokens pay on this target where the 4 rows asked for would not
    verify = [0.0] + [10.0 + 3.5 * (r - 1) for r in range(1, 9)]
    m = Machine(verify, 1.0, [1.0, 0.0] + [1.0] * (K - 2))
    pol = DraftPolicy(m.cost(), K, BLOCK, cut=0.5)
    st = pol.new_sequence()
    total = tokens = 0.0
    for _ in range(400):
        k = pol.choose([st], [K], [3])[0]
        drafted = min(k, 2)
        kept = m.kept(drafted)
        ms = m.step_ms(1 + drafted, k > 0)
        total, tokens = total + ms, tokens + kept + 1
        pol.observe([st], [Outcome(k, drafted, kept)], verify[1 + drafted], m.draft if k else 0.0, ms)
    assert verify[1] * tokens / total > 1.05


def test_a_slow_stretch_of_the_machine_is_not_learnt_as_the_cost_of_its_steps():
    m = Machine(MEMORY_BOUND, 2.0, [0.8] * K)
    pol = DraftPolicy(m.cost(), K, BLOCK)
    run(m, 300, policy=pol)
    before = pol.cost.step_ms(8, BLOCK)
    st = pol.new_sequence()
    for _ in range(30):  # every kind of step 3x slower for a while
        k = pol.choose([st], [K], [0])[0]
        a = m.kept(k)
        pol.observe(
            [st], [Outcome(k, k, a)], 3 * m.verify[1 + k], 3 * m.draft if k else 0.0, 3 * m.step_ms(1 + k, k > 0)
        )
    assert pol.cost.step_ms(8, BLOCK) < 1.5 * before
    assert pol.speed.value > 2.0


def test_the_machine_speed_follows_a_busy_stretch_and_returns():
    s = MachineSpeed()
    for _ in range(40):
        s.observe(1, False, 10.0)
    assert s.value == pytest.approx(1.0)
    for _ in range(20):
        s.observe(1, False, 20.0)
    assert s.value > 1.8
    for _ in range(20):
        s.observe(1, False, 10.0)
    assert s.value < 1.1


def test_the_cost_model_learns_what_steps_take():
    cost = CostModel([1, 8], [10.0, 12.0], [8], [2.0], 8)
    for _ in range(100):
        cost.observe(4, 20.0, 8, 4.0, 1.0)
        cost.observe(1, 15.0, 0, 0.0, 0.5)
    assert cost.step_ms(4, 8) == pytest.approx(25.0, rel=0.01)
    assert cost.step_ms(1, 0) == pytest.approx(15.5, rel=0.01)
    assert cost.verify_ms(8) > cost.verify_ms(4) > cost.verify_ms(1)  # unseen sizes follow their neighbours


def test_pass_sizes_seen_once_each_teach_the_sizes_about_them():
    """Drafting steps of many sequences rarely repeat a row count: a correction kept per
    exact size would stay near the plain steps' while every big pass runs slower."""
    table = ([1, 8, 16, 32, 64, 128], [10.0, 12.0, 20.0, 30.0, 50.0, 90.0], [8], [2.0], 128)
    calibrated, cost = CostModel(*table), CostModel(*table)
    for _ in range(50):
        cost.observe(16, 24.0, 0, 0.0, 0.0)  # plain steps: 1.2x their calibration
    for rows in random.Random(3).sample(range(66, 100), 12):  # drafting steps: 1.5x, no size twice
        cost.observe(rows, 1.5 * calibrated.verify_ms(rows), 8, 2.0, 0.0)
    assert cost.verify_ms(80) == pytest.approx(1.5 * calibrated.verify_ms(80), rel=0.08)
    assert cost.verify_ms(16) == pytest.approx(24.0, rel=0.01)  # the plain steps' own size keeps its own


def test_the_joint_choice_of_many_sequences_is_a_local_best_at_least_as_good_as_its_starts():
    """Whatever the search keeps track of, its answer for 16 sequences of mixed acceptance
    beats every common length, every sequence at its lone best, and every one-sequence change."""
    rng = random.Random(7)
    cost = CostModel([1, 16, 32, 64, 128], [2.7, 6.0, 7.2, 10.3, 16.8], [8, 64, 128], [3.0, 6.1, 9.2], 128)
    pol = DraftPolicy(cost, K, BLOCK)
    for _ in range(20):
        opts = [pol._option([rng.uniform(0.2, 0.95)] * K, [1.0] * K, 0, K) for _ in range(16)]
        ks = pol._joint(opts)
        best = pol._rate(opts, ks)
        for k in range(K + 1):
            assert best >= pol._rate(opts, [k] * 16) * (1 - 1e-9)
        assert best >= pol._rate(opts, [pol._joint([o])[0] for o in opts]) * (1 - 1e-9)
        for i in range(16):
            for k in range(K + 1):
                assert best >= pol._rate(opts, [*ks[:i], k, *ks[i + 1 :]]) * (1 - 1e-9)
