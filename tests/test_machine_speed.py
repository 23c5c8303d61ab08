"""The machine's speed that the adaptive draft length divides its timings by
(``pydflash.drafting.cost.MachineSpeed``): a slow interval of a shared machine is not
the cost of the kind of step that ran in it."""

from __future__ import annotations

import pytest

from pydflash.drafting.cost import SPEED_CLIP, SPEED_GATE, MachineSpeed
from pydflash.drafting.policy import PLAIN_SAMPLE, SWITCH_STEPS, DraftPolicy
from test_draft_policy import cost

MAX_DRAFT = 7


def known() -> MachineSpeed:
    """A speed that has seen SPEED_GATE plain steps of 10 ms, one by one."""
    s = MachineSpeed()
    for _ in range(SPEED_GATE):
        s.observe(1, False, 10.0)
    return s


def test_a_slow_interval_is_the_machines_speed_and_a_lasting_change_the_kinds_time():
    s = known()
    assert s.value == 1.0  # a kind's first steps set its usual time, not the speed
    for _ in range(10):
        s.observe(1, False, 20.0)
    assert s.value > 1.9  # twice as slow: shows within 10 steps
    for _ in range(10):
        s.observe(1, False, 10.0)
    assert s.value == pytest.approx(1.0, abs=0.05)
    for _ in range(2000):  # lasting: becomes the kind's usual time
        s.observe(1, False, 20.0)
    assert s.value == pytest.approx(1.0, abs=0.01)


def test_each_kind_of_step_is_measured_against_its_own_usual_time():
    s = MachineSpeed()
    for _ in range(SPEED_GATE):
        s.observe(1, False, 10.0)
        s.observe(8, True, 30.0)
    for _ in range(20):  # the usual times of both kinds: the machine as usual
        s.observe(1, False, 10.0)
        s.observe(8, True, 30.0)
    assert s.value == pytest.approx(1.0)
    for _ in range(10):
        s.observe(8, True, 45.0)
    assert s.value == pytest.approx(1.5, rel=0.05)
    for _ in range(5):  # a kind not yet known says nothing of the speed
        s.observe(4, True, 500.0)
    assert s.value == pytest.approx(1.5, rel=0.05)


def test_one_stalled_step_moves_the_speed_as_a_clipped_one():
    s = known()
    s.observe(1, False, 10_000.0)  # a pause (a page fault, a descheduled thread)
    assert s.value == pytest.approx(1.0 + 0.3 * (SPEED_CLIP - 1.0))


def test_a_run_moves_the_speed_as_its_steps_one_by_one_would_once_the_kind_is_known():
    one, run = known(), MachineSpeed()
    run.observe(1, False, 10.0, times=SPEED_GATE)
    for _ in range(PLAIN_SAMPLE):
        one.observe(1, False, 15.0)
    run.observe(1, False, 15.0, times=PLAIN_SAMPLE)
    assert run.value == pytest.approx(one.value, rel=0.01)  # the usual time moves 2% per 4 steps


def test_a_slow_interval_of_plain_steps_does_not_lift_the_veto():
    # where drafting realized less than plain steps, a slow stretch of plain steps made
    # them look as slow as drafting (each rate learned it as its own kind's cost): the
    # veto lifted and drafting came back for as long as the stretch lasted (before the
    # speed, at the 14th slow step, with the model's plain step at 17.7 ms)
    p = DraftPolicy(cost(2.0, draft_ms=0.0), MAX_DRAFT)  # a drafting step of k: 10 + 2k ms, as modelled
    for _ in range(60):  # drafting: 3 tokens in 45 ms (0.067 per ms); plain: 1 in 10 (0.1)
        # ... of which the model's 24 ms of a step of 7 is all its passes took: the rest
        # is what it misses (3 tokens in 24 ms would have paid: the veto is the costs')
        p.observe_step(1 + MAX_DRAFT, 24.0, 8, 0.0, 24.0)
        p.observe_lone(3, True, 45.0, k=MAX_DRAFT)
    for _ in range(60):
        p.observe_step(1, 10.0, 0, 0.0, 10.0)
        p.observe_lone(1, False, 10.0)
    assert p.drafting_loses()
    for _ in range(40):  # the machine twice as slow for 40 plain steps
        p.observe_step(1, 20.0, 0, 0.0, 20.0)
        p.observe_lone(1, False, 20.0)
        assert p.drafting_loses()
    assert p.cost.step_ms(1, 0) < 12.0  # nor the plain steps' cost
    assert p.speed.value > 1.6  # the machine's (its usual plain step moved 18% in 40)


def test_a_slow_interval_of_drafting_steps_does_not_stop_drafting():
    # the other way round: a stretch 3x as slow while drafting (every draft kept) made
    # drafting look worse than the plain steps measured before it
    p = DraftPolicy(cost(0.5), MAX_DRAFT)  # memory-bound: a drafting step of k, 10 + 0.5k ms (+0.2)
    st = p.new_sequence()
    ks = []
    for i in range(140):
        k = p.choose([st], [MAX_DRAFT], [0])[0]
        slow = 3.0 if i >= 100 else 1.0
        assert i < 100 or k > 0, f"step {i}: drafting stopped in the slow stretch"
        if k == 0:
            p.observe_step(1, 10.0 * slow, 0, 0.0, 10.0 * slow)
            p.observe_lone(1, False, 10.0 * slow)
            continue
        ks.append(k)
        ms = p.cost.step_ms(1 + k, 1 + k)  # the model's own time: nothing to learn but the speed
        p.observe_sequence(st, k, k)
        p.observe_step(1 + k, (ms - 0.2) * slow, 1 + k, 0.2 * slow, ms * slow)
        p.observe_lone(k + 1, True, ms * slow, probe=st.probing, k=k)
    assert p.plain_rate.n >= 5 and not p.drafting_loses()
    assert min(ks[-30:]) >= MAX_DRAFT - 1  # nor made it draft shorter


def test_a_probe_after_plain_steps_says_nothing_of_the_machines_speed():
    # the first drafting step after plain ones (a probe, or drafting resumed) also injects
    # the rows its sequence deferred and rebuilds llama.cpp's graphs: one-off costs, not the
    # machine's. Counted, one probe at 1.5x its kind's usual time put the speed at ~1.15,
    # and the switch's plain steps after it, divided by that, summed to a negative extra
    # time (logged on the embedded pair: -0.4 to -0.67 ms), so probes came more often
    p = DraftPolicy(cost(0.5), MAX_DRAFT)
    drafting = p.cost.step_ms(1 + MAX_DRAFT, 1 + MAX_DRAFT)
    for _ in range(SPEED_GATE + 5):  # the usual drafting step, then the usual plain step
        p.observe_step(1 + MAX_DRAFT, drafting - 0.2, 1 + MAX_DRAFT, 0.2, drafting)
    for _ in range(2 * SWITCH_STEPS + SPEED_GATE):  # past a first switch (the model sees plain steps)
        p.observe_step(1, 10.0, 0, 0.0, 10.0)
    assert p.speed.value == pytest.approx(1.0) and p.cost.step_ms(1, 0) == pytest.approx(10.0)
    p.observe_step(1 + MAX_DRAFT, 1.5 * drafting - 0.2, 1 + MAX_DRAFT, 0.2, 1.5 * drafting)  # the probe
    assert p.speed.value == pytest.approx(1.0)
    for wall in [14.0, 12.0, 11.0] + [10.0] * 13:  # the switch: 7 ms over 16 plain steps
        p.observe_step(1, wall, 0, 0.0, wall)
    assert p.switch_ms == pytest.approx(7.0, rel=0.05)
    # a drafting step after a drafting one is the machine's, as before
    p.observe_step(1 + MAX_DRAFT, drafting - 0.2, 1 + MAX_DRAFT, 0.2, drafting)
    p.observe_step(1 + MAX_DRAFT, 1.5 * drafting - 0.2, 1 + MAX_DRAFT, 0.2, 1.5 * drafting)
    assert p.speed.value > 1.1
