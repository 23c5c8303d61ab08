"""The adaptive draft length: how many tokens each running sequence drafts this step.

A step of k drafted tokens yields on average ``E(k) = 1 + sum_{j<=k} prod_{i<=j} c_i``
tokens, c_i being the conditional acceptance of draft position i (the chance the
i-th drafted token is kept when the ones before it were). It costs one target
pass over every sequence's ``1 + k`` rows, one drafter pass over the blocks of
the sequences that draft (a whole block each, whatever k keeps of it; none when
no sequence drafts) and a per-step overhead (feature injection, sampling, the
engine's own work), measured apart for steps with and without a drafter pass: a
plain step defers its feature injection (ContextPair), so it costs about what
the target alone costs. The policy picks the
lengths that maximise expected tokens per second over all the running sequences
together, since they share both passes:

- ``CostModel`` (``_draft_cost``): pass times by row count, calibrated once on the pair
  (``ContextPair.calibrate``: the machine, model and backend decide them), then
  scaled online from the timings every step returns (the context grows), each
  divided first by the machine's speed (``MachineSpeed``: a busy stretch of a
  shared machine is not the cost of the kind of step that ran in it);
- ``Acceptance`` (``_draft_acceptance``): one sequence's c_i, exponentially weighted
  over its recent steps (a rejected position counts against itself only; positions
  after it were not tried), each position's prior the pair's running estimate of it
  over every sequence (slower to change: one unlucky step does not stop drafting;
  the pair's own estimate takes each position's prior from the one before it where
  that is higher than ``PRIOR_ACCEPTANCE``: acceptance changes smoothly along a
  block, and a kept token makes the next likelier, but a rejected first position
  says nothing of the positions after it; where a sequence keeps less than the pair
  at a later position, the priors after it are scaled down by as much);
- the confidence cut (``CONFIDENCE_CUT``, a DFlash drafter's): a draft ends at the
  first token the drafter is unsure of, so a step verifies fewer rows than it asked
  for; each sequence's chance that the cut lets each position in (``SequenceDraft.passing``,
  estimated as acceptance is) prices a length at the rows expected to be left and
  the tokens at the chance of each position passing and being kept;
- ``choose_lengths`` (``_draft_choice``): the joint choice, a coordinate ascent over sequences;
- ``DraftPolicy``: the engine's side: per-sequence state, probing, observation.

When drafting does not pay (low acceptance, many busy sequences sharing a
verification pass) a sequence's length is 0: plain target decoding, no drafter
pass. While off, its estimate returns toward the pair's running one step by
step (a burst of rejections does not stop it for good), and it probes now and
then with a full draft, so the estimates can recover where the pair's is low
too; a probe that does not resume speculation doubles the wait before the next,
and the waits are long enough that probes cost at most ``PROBE_BUDGET`` of the
time (a probe's expected loss against plain steps, at the estimates of then and
at least at the time probes measured, plus the measured extra time of the plain
steps after it: llama.cpp rebuilds its graphs for the sizes it switches between, and
the target's weights come back into the caches). A new pair's first probes follow
the doubling wait alone (``PROBE_NEWS``): its estimate then comes from a generation's
first positions, where drafters keep least.

Pure Python without the model: tests drive it with synthetic costs and acceptances.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from .acceptance import PRIOR_ACCEPTANCE, Acceptance, expected_gains, expected_tokens
from .choice import Choice, best_alone, choose_lengths, drafter_rows
from .cost import CostModel, MachineSpeed, Rate

__all__ = [
    "CONFIDENCE_CUT",
    "Acceptance",
    "CostModel",
    "DraftPolicy",
    "Rate",
    "SequenceDraft",
    "choose_lengths",
    "drafter_rows",
    "expected_tokens",
]

POOLED_DECAY = 0.98  # the pair's running estimate (the prior of new sequences)
PROBE_WEIGHT = 2.0  # a probe counts as this many steps (it is the only news while off)
PROBE_FIRST = 4  # steps off before the first probe
PROBE_MAX = 64  # the longest doubling wait between probes (a costly probe waits longer)
PROBE_BUDGET = 0.01  # probes cost at most this share of the time (their expected loss) ...
PROBE_ROOM = 0.5  # ... where a whole block kept would save this share of it or more; less pro rata
PROBE_ALPHA = 0.25  # weight of each lone probe's measured time (probes are few; the first sets it)
# until the pair has observed this many drafting steps, probes follow the doubling wait alone
# where a whole block kept would save PROBE_ROOM of its time or more: a new pair's first drafts
# come at a generation's first positions, where drafters keep least (the shipped pair kept
# nothing for 3-11 steps, then most blocks whole), and budgeted at an estimate from those
# alone, probes came 63-72 steps apart (the demo's first prompt after 8 tokens of warm-up read
# 0.99-1.32x the target alone in 14 of 24 processes)
PROBE_NEWS = 16
# the longest wait between probes, whatever they cost: it binds only where a probe costs over
# PROBE_BUDGET of that many plain steps (at 1,024 the embedded pair's probes, ~4 ms against
# plain steps of ~0.33 ms, took ~1.2% of its decode time); it bounds how late a pair finds
# that drafting has come to pay
PROBE_WAIT_MAX = 4096
RECHECK = 4  # a lone sequence that is off weighs drafting again every this many steps at least,
RECHECK_MAX = 64  # ... at most, and between them as often as CHOICE_BUDGET allows (powers of 2)
# the weighings of a lone sequence that is off cost at most this share of its steps (they
# can only turn drafting on through its estimate's drift toward the pair's, which takes tens
# of steps; at 1% one took 38 us in the engine's thread, every 6 steps on the embedded pair:
# 1.6% of its decode time)
CHOICE_BUDGET = 0.0025
# a lone sequence's realized tokens per ms over about its last 20 plain and 20 drafting
# steps: slow enough to say whether drafting pays on this pair and machine (a compute-bound
# target), not whether it paid in the last stretch (the acceptance estimates' business)
RATE_DECAY = 0.95
RATE_MIN = 5.0  # weight of each kind seen before the realized rates may overrule the model
# a lone sequence that drafts every step takes a plain one after this many drafting steps
# while plain steps' realized rate is unknown: the model's plain cost comes from a
# calibration that may have run at a noisy moment, and only plain steps correct it
PLAIN_CHECK = 16
# the plain steps after a drafting step whose excess time over a plain step's the drafting
# caused: llama.cpp rebuilds both graphs for the sizes it switches to, and on a small CPU
# model the drafter's pass evicted the target's weights from the caches (on the embedded
# pair the steps stayed slow for 10-20 steps, together 1.4-15 ms: more than the rebuild)
SWITCH_STEPS = 16
# a lone sequence's plain steps between weighings, outside a switch's steps: every this
# many is observed (observing one costs ~10 us of Python in the engine's thread, 1% of a
# plain step of the embedded target; the costs they measure change slowly)
PLAIN_SAMPLE = 4
# steps after a prompt's prefill whose times are not their kind's (llama.cpp rebuilds the graph after
# the prompt's batch: on the embedded target the first plain step took 1.9x the usual, the next 1.14x, 1.04x)
PREFILL_STEPS = 3
# a DFlash drafter's draft ends at the first position whose token has less than this
# probability under the drafter (draft_p_min's measure, llama.cpp's: the softmax of its 10
# largest logits), unless the generation sets draft_p_min: a step's length
# follows the drafter's confidence in each token, the history of steps before it the
# chance of each kept. The expected rows that the cut leaves, and the tokens, are what
# the choice weighs (SequenceDraft.passing). Chosen in one process on the padded pair,
# 40 prompts each, the adaptive engine over fixed draft_max 2 by the ratio of median
# speeds: prose 0.970 at 0.3, 0.995 at 0.5, 0.951 at 0.65, 0.870 at 0.8; code 1.035,
# 1.113, 1.096 (on the whole vocabulary's softmax, before the passes were modelled,
# 0.3 had read best). The bench with it: README, "Adaptive draft length", run23-24
CONFIDENCE_CUT = 0.5


@dataclasses.dataclass
class SequenceDraft:
    """One generation's draft-length state in the policy."""

    acceptance: Acceptance  # c_i: a token kept, where the cut let it into the draft
    passing: Acceptance  # a position let into the draft by the confidence cut, where the one before it was
    off_steps: int = 0  # steps in a row chosen 0 (not probing)
    probe_wait: int = PROBE_FIRST  # off steps before the next probe (doubling while probes fail)
    spacing: int = 0  # ... and at least this many: what keeps probes within PROBE_BUDGET
    unforgotten: int = 0  # off steps skipped between checks whose forget() is still due
    probing: bool = False  # this step is a probe
    weighed: bool = False  # its choice was weighed at least once (a new sequence is, at its first step)
    # DraftPolicy.news when a weighing found that no drift of its estimate toward the
    # pair's could turn drafting on (-1: not): its weighings wait for news or a probe
    settled: int = -1

    def forget(self, steps: int = 1) -> None:
        """Steps off: both estimates return toward the pair's."""
        self.acceptance.forget(steps)
        self.passing.forget(steps)


class DraftPolicy:
    """The engine's adaptive draft length: per-sequence acceptance, the pair's
    cost model, probing. ``choose`` before a step, ``observe`` after it."""

    def __init__(self, cost: CostModel, max_draft: int, pass_rows: int = 0, cut: float = 0.0):
        self.cost = cost
        self.max_draft = max_draft
        self.pass_rows = pass_rows  # drafter rows per drafting sequence (0: 1 + k)
        self.cut = cut  # the confidence cut of its sequences' drafts (draft_p_min where they set none)
        self.pooled = Acceptance(max_draft, PRIOR_ACCEPTANCE, POOLED_DECAY)
        # the pair's estimate of the cut's passes: every position passes until one is seen not to
        # (a draft's full rows: what the choice weighs without a cut)
        self.pooled_pass = Acceptance(max_draft, 1.0, POOLED_DECAY)
        # steps between weighings of a lone sequence that is off: a full choice takes
        # ~20-40 us of Python, 5-10% of a plain step of a small compute-bound target
        self.recheck = RECHECK
        self._choice_ms = 0.0  # a weighing's time, averaged (one timing in a busy thread is noisy)
        self.timer = time.perf_counter  # what times it (benchmarks/policy_sim.py gives its own clock)
        self._clock: tuple[int, int, int] | None = None  # the last ended generation's steps off, spacing, settled
        self.news = 0  # drafting steps observed: each moves the pair's estimate (SequenceDraft.settled)
        # what a lone sequence's plain and drafting steps (probes aside) realized
        # (observe_lone): the check on the model where one sequence has the pair
        self.plain_rate = Rate(RATE_DECAY)
        self.draft_rate = Rate(RATE_DECAY)
        # the same drafting steps' tokens per ms at the model's costs: where those lose
        # too, their acceptance explains the loss (drafting_loses)
        self.draft_modelled = Rate(RATE_DECAY)
        # the SWITCH_STEPS steps without a drafter pass after one with are slower than plain
        # steps (llama.cpp rebuilds both graphs for the new sizes; on the embedded target
        # the first took 2x a plain step, and the target's weights come back into the
        # caches). Their excess over the model's plain step (as it stood before them) is
        # part of what a probe costs and stays out of the plain steps' modelled cost
        self.switch_ms = 0.0  # a switch's total excess, averaged over switches
        self._switches = 0  # switches measured
        self._after = SWITCH_STEPS  # plain steps observed since the last drafting step
        self._switch_sum = 0.0  # this switch's excess so far (unclipped: noise averages out)
        self._switch_base = (0, 0.0)  # the rows of its plain steps and their modelled time
        # the first of them (llama.cpp's graph rebuild) is also charged to drafting in a lone
        # sequence's realized rates; the later ones only to probes: on a target whose weights
        # outgrow the caches they are plain steps, and their noise would bias the rates
        self._switch_excess = 0.0  # the last observed step's excess, if it was the first
        self._unsettled = 0  # steps still slowed by the last prefill (prefilled())
        self._settling = False  # observe_step's last step was one of them (observe_lone skips its time)
        self._veto = False  # drafting_loses() as of the last weighing, drafting step or check
        self._skipped = 0  # plain steps skipped (observe_plain), for its sampling
        self._lone_drafts = 0  # a lone sequence's drafting steps since its last plain one
        self._probed = False  # its last drafting step was a probe
        # a lone probe's measured wall time (0: none yet): with the injection of the rows
        # its sequence deferred while off and llama.cpp's graph rebuild for the sizes it
        # switches to, a probe costs more than a drafting step of a run (the model's)
        self.probe_ms = 0.0
        self.speed = MachineSpeed()  # every timing is divided by it: the model's times are the machine's at speed 1

    def new_sequence(self) -> SequenceDraft:
        """A generation's state, its prior the pair's running estimate. Where the last
        generation to end was off, the new one keeps its count of steps off and the
        spacing that keeps probes within PROBE_BUDGET (costly probes stay that sparse
        over a run of short generations instead of coming once per generation); the
        doubling wait starts anew (a new prompt may draft better: cheap probes come
        soon). A new estimate is the pair's: where the last one was settled since the
        pair's last news, so is the new one (no weighing at its first step)."""
        st = SequenceDraft(Acceptance(self.max_draft, self.pooled), Acceptance(self.max_draft, self.pooled_pass))
        if self._clock is not None:
            st.off_steps, st.spacing, settled = self._clock
            if settled == self.news:
                st.settled, st.weighed = settled, True
        return st

    def starts_settled(self, st: SequenceDraft) -> bool:
        """A new generation that starts off with no weighing due before news (a
        drafting step, a probe): its prompt's features can wait for its drafter's
        next pass, as a plain step's do (on the embedded pair the prompt's injection
        took ~0.9 of 6.7 ms of prefill, for a drafter that then drafts nothing)."""
        return st.weighed and st.settled == self.news

    def end_sequence(self, st: SequenceDraft) -> None:
        """A generation ended: its probe clock, where it was off, goes to the next."""
        self._clock = (st.off_steps, st.spacing, st.settled) if st.off_steps > 0 else None

    def prefilled(self) -> None:
        """A prompt (or part of one) was read: the next PREFILL_STEPS steps' times say
        nothing of their kind's cost, the machine's speed or the realized rates (a
        drafting step among them still starts a switch and its acceptance counts)."""
        self._unsettled = PREFILL_STEPS

    def choose(self, states: Sequence[SequenceDraft | None], caps: Sequence[int], floors: Sequence[int]) -> list[int]:
        """This step's length per sequence. ``states[i]`` None: pinned to ``caps[i]``;
        otherwise chosen in 0..caps[i] (a length under ``floors[i]``, draft_min, is 0)."""
        lone = states[0] if len(states) == 1 else None
        if lone is not None and self.skip(lone):
            return [0]
        t0 = self.timer() if lone is not None else 0.0
        ks = self._choose(states, caps, floors)
        if lone is not None and ks[0] == 0 and not lone.probing:
            # the next weighing waits until this one's time is CHOICE_BUDGET of the plain steps between
            took = (self.timer() - t0) * 1e3
            last = self._choice_ms if self._choice_ms > 0 else took
            self._choice_ms = last + PROBE_ALPHA * (took - last)
            n = math.ceil(self._choice_ms / (CHOICE_BUDGET * max(self.cost.step_ms(1, 0), 1e-6)))
            # a power of two: as it moves with the weighings' jitter, the next one stays
            # where the steps since the last put it (off_steps % recheck)
            self.recheck = min(max(1 << (n - 1).bit_length(), RECHECK), RECHECK_MAX)
            self._veto = self.drafting_loses()
            lone.settled = self.news if self._settled(lone) else -1
        return ks

    def _settled(self, st: SequenceDraft) -> bool:
        """No drift of the sequence's estimate can turn drafting on before the pair's
        estimate changes: while off, each position's estimate without the scaling along
        the block (which bounds the one with it) moves from where it is toward the
        pair's, so it stays under the higher of the two, and with those
        (the longest draft allowed, any draft_min) the model still chooses 0. Then its
        weighings until the next news or probe would only say 0 again (on the embedded
        pair they cost 1.2-1.5% of its decode time: a choice's Python, and the step it
        takes alone, out of a run)."""
        pooled, passes = self.pooled.conditional(), self.pooled_pass.conditional()
        high = [max(a, b) for a, b in zip(st.acceptance.conditional(pooled, along=False), pooled, strict=True)]
        mine = st.passing.conditional(passes, along=False)
        # its passes move toward the pair's too: the higher of the two, the most tokens (the rows
        # priced at the lower: no cheaper step)
        high = [c * max(a, b) for c, a, b in zip(high, mine, passes, strict=True)]
        rows = expected_gains([min(a, b) for a, b in zip(mine, passes, strict=True)], self.max_draft)
        best = Choice(expected_gains(high, self.max_draft), 1, self.max_draft, rows=rows)
        return best_alone(self.cost, best, self.pass_rows) == 0

    def skip(self, st: SequenceDraft) -> bool:
        """For a sequence stepping alone: True (a plain step, counted) when it is off
        between weighings with no probe due, which is most steps of a pair whose
        drafting does not pay: only its estimate's drift toward the pair's could
        bring drafting back, weighed every ``recheck`` steps. The engine asks this
        before anything else, so such a step costs about what the target's costs."""
        # while drafting realizes less than plain steps a weighing cannot turn it on (the
        # realized rates overrule the model): a due weighing waits until they no longer
        # say so (one comparison instead of a choice)
        if (
            st.weighed
            and st.off_steps + 1 < max(st.probe_wait, st.spacing)
            and (st.settled == self.news or st.off_steps % self.recheck or (self._veto and self._still_vetoed()))
        ):
            st.off_steps += 1
            st.unforgotten += 1
            return True
        return False

    def plain_run(self, st: SequenceDraft, n_max: int) -> int:
        """``skip`` for up to ``n_max`` steps at once: the plain steps a lone sequence
        takes now (0: weigh this step), ending before the next weighing or probe would
        be due (a veto is checked where it would be, with the rates of the run's
        start)."""
        off = st.off_steps
        n = min(n_max, max(st.probe_wait, st.spacing) - 1 - off) if st.weighed else 0
        to_weigh = -off % self.recheck  # steps before the next due weighing
        if to_weigh < n and st.settled != self.news and not (self._veto and self._still_vetoed()):
            n = to_weigh
        if n <= 0:
            return 0
        st.off_steps += n
        st.unforgotten += n
        return n

    def unrun(self, st: SequenceDraft, n: int) -> None:
        """``n`` of the steps that ``plain_run`` (and the weighing before it) counted
        were not taken: the generation ended first (max_tokens, an end-of-generation
        token). Counted, its steps off ran ahead of the steps taken: on the embedded
        pair, with the bench's 4-token generation before each timed one, probes came
        every ~700 steps where their spacing said 1,024."""
        st.off_steps = max(st.off_steps - n, 0)
        st.unforgotten = max(st.unforgotten - n, 0)

    def _still_vetoed(self) -> bool:
        self._veto = self.drafting_loses()
        return self._veto

    def _choose(self, states: Sequence[SequenceDraft | None], caps: Sequence[int], floors: Sequence[int]) -> list[int]:
        choices: list[Choice] = []
        pooled = self.pooled.conditional()  # every sequence's prior (computed once)
        passes = self.pooled_pass.conditional()
        for st, cap, lo in zip(states, caps, floors, strict=True):
            cap = max(0, min(cap, self.max_draft))
            if st is None:  # its gain counts in the rate (the pair's estimate); its length is given
                choices.append(Choice(expected_gains(pooled, cap), 0, cap, pinned=cap))
            else:
                if st.unforgotten:
                    st.forget(st.unforgotten)
                    st.unforgotten = 0
                kept = st.acceptance.conditional(pooled)
                passing = st.passing.conditional(passes, along=False)
                gains = expected_gains([c * p for c, p in zip(kept, passing, strict=True)], cap)
                choices.append(Choice(gains, lo, cap, rows=expected_gains(passing, cap)))
        ks = choose_lengths(self.cost, choices, self.pass_rows)
        if len(ks) == 1 and ks[0] > 0 and states[0] is not None:
            if self.drafting_loses():
                ks[0] = 0  # the model says drafting pays, what it realized says not: off (probes go on)
            elif self.plain_rate.n < RATE_MIN and self._lone_drafts >= PLAIN_CHECK:
                ks[0] = 0  # plain steps' realized rate is not known yet: measure it (off for a recheck)
        for i, (st, c) in enumerate(zip(states, choices, strict=True)):
            if st is None or c.hi < max(c.lo, 1):
                continue
            st.probing, st.weighed = False, True
            if ks[i] > 0:
                st.off_steps, st.probe_wait = 0, PROBE_FIRST
                continue
            st.off_steps += 1
            st.forget()  # while off its estimates return toward the pair's
            if st.off_steps < max(st.probe_wait, st.spacing):
                continue
            st.spacing = self.probe_spacing(c)
            if st.off_steps >= st.spacing:  # probe with the longest draft allowed
                ks[i], st.probing, st.off_steps, st.spacing = c.hi, True, 0, 0
                st.probe_wait = min(st.probe_wait * 2, PROBE_MAX)
        return ks

    def _lone_ms(self, k: int) -> float:
        """The model's time for a step of one sequence drafting ``k`` (0: a plain step)."""
        return self.cost.step_ms(1 + k, drafter_rows(k, self.pass_rows))

    def probe_spacing(self, c: Choice) -> int:
        """Plain steps per probe that keep probes within their budget of the time (by
        what they could find: the share a whole block kept saves, see PROBE_ROOM): a
        probe's expected loss against plain steps (its time less what its expected
        tokens take plainly), at the current estimates and costs. 0 (the doubling wait
        alone) while the pair has seen fewer than PROBE_NEWS drafting steps and a block
        kept could save PROBE_ROOM of its time."""
        plain, k = max(self.cost.step_ms(1, 0), 1e-9), self.max_draft
        # probes' measured time where it exceeds the model's: the calibration times passes
        # on an empty slot with warm caches (the embedded pair's put a block at 1.1 ms where
        # probes took 3.7 and 8 plain steps 3.1), and the model learns from the few probes slowly
        room = 1.0 - max(self._lone_ms(k), self.probe_ms) / ((1 + k) * plain)
        if self.news < PROBE_NEWS and room >= PROBE_ROOM:
            return 0
        budget = PROBE_BUDGET * min(room / PROBE_ROOM, 1.0)
        probe = max(self._lone_ms(c.hi), self.probe_ms)
        loss = probe - c.gains[min(c.hi, len(c.gains) - 1)] * plain
        realized = self._realized()
        if realized is not None:  # what drafting realized lately, where it is worse than the estimates
            loss = max(loss, probe * (1.0 - realized))
        loss += max(self.switch_ms, 0.0)  # and the plain step after it, slower by the switch of sizes
        if loss <= 0:
            return 0
        return min(math.ceil(loss / (budget * plain)), PROBE_WAIT_MAX) if budget > 0 else PROBE_WAIT_MAX

    def observe_sequence(self, st: SequenceDraft, n_drafted: int, n_accepted: int, n_asked: int = -1) -> None:
        """One sequence's step that asked for ``n_asked`` drafted tokens (-1: as many as
        it drafted) and drafted ``n_drafted`` (fewer: the confidence cut, a grammar, the
        end of the budget ended the draft): only steps that asked say anything about the
        cut, only those that drafted about acceptance."""
        if n_asked < 0:
            n_asked = n_drafted
        if n_asked <= 0:
            return
        weight = PROBE_WEIGHT if st.probing else 1.0
        st.passing.observe(n_asked, n_drafted, weight)
        self.pooled_pass.observe(n_asked, n_drafted)
        if n_drafted > 0:
            st.acceptance.observe(n_drafted, n_accepted, weight)
            self.pooled.observe(n_drafted, n_accepted)
        self.news += 1

    def observe_lone(
        self, tokens: int, drafted: bool, wall_ms: float, probe: bool = False, times: int = 1, k: int = 0
    ) -> None:
        """A step of one sequence alone: the tokens it gave and its wall time, as a
        plain or a drafting step (``probe``: a probe's, of ``k`` drafted tokens). A
        switch back (``observe_step`` just saw one) is a plain step whose excess time
        the drafting before it caused."""
        wall_ms /= self.speed.value
        self._lone_drafts = self._lone_drafts + 1 if drafted else 0
        if drafted:
            self._probed = probe
        if self._settling:
            return
        if drafted:
            if probe:  # the first probe sets it
                last = self.probe_ms if self.probe_ms > 0 else wall_ms
                self.probe_ms = last + PROBE_ALPHA * (wall_ms - last)
                # a probe drafts the whole block, which on a target whose passes grow with
                # rows can lose where the shorter drafts the model chooses pay: its rate is
                # not drafting's (counted, probes that lost kept a pair off for prompts where
                # a fixed short draft gave 1.3-1.7x). One whose outcome beat plain steps at
                # some length says the rates that keep drafting off are stale: they start
                # anew from the next drafts
                p = self.plain_rate
                if p.n >= RATE_MIN and self._probe_rate(tokens, wall_ms, k) >= p.value():
                    self.draft_rate, self.draft_modelled = Rate(RATE_DECAY), Rate(RATE_DECAY)
            else:
                self.draft_rate.observe(tokens, wall_ms)
                # its drafter pass ran whatever the cut left of the draft (k: what it verified)
                self.draft_modelled.observe(tokens, self.cost.step_ms(1 + k, self.pass_rows or drafter_rows(k, 0)))
            self._veto = self.drafting_loses()
            return
        excess = self._switch_excess
        self.plain_rate.observe(tokens, wall_ms - excess, times)
        if excess > 0 and self.draft_rate.n > 0 and not self._probed:  # a probe's switch: its own cost
            self.draft_rate.charge(excess)

    def _probe_rate(self, tokens: int, wall_ms: float, k: int) -> float:
        """Tokens per ms a probe of ``k`` that gave ``tokens`` would have realized at its
        best length j <= k: a draft of j keeps min(tokens - 1, j) of them, in the
        model's time for that step scaled by what the probe took over the model's time
        for its own (its one-off costs, the deferred rows' injection and the graph
        rebuild, scale with it: a conservative test). On the padded pair a probe took
        about 2 plain steps' time (26.7 ms against 13.8): one that kept 1 of its 7
        tied or lost, where a draft of 1 would have paid."""
        rate = tokens / max(wall_ms, 1e-9)  # j = k: what it realized
        if k <= 1:
            return rate
        scale = wall_ms / max(self._lone_ms(k), 1e-9)
        for j in range(1, k):
            ms = self._lone_ms(j) * scale
            rate = max(rate, (min(tokens - 1, j) + 1) / max(ms, 1e-9))
        return rate

    def observe_plain(self, verify_ms: float, wall_ms: float, tokens: int = 1) -> None:
        """A lone sequence's plain step that ``skip`` chose: ``observe_step`` and
        ``observe_lone`` as for any plain step of one row, every PLAIN_SAMPLE-th
        outside a switch's steps, counted PLAIN_SAMPLE times (a switch's steps are all
        observed: their sum is the switch's)."""
        times = 1
        if self._unsettled:
            self._unsettled -= 1
            return
        if self._after >= SWITCH_STEPS:
            self._skipped += 1
            if self._skipped % PLAIN_SAMPLE:
                return
            times = PLAIN_SAMPLE  # standing for the steps not observed: the estimates keep their pace
        self.observe_step(1, verify_ms, 0, 0.0, wall_ms, times)
        self.observe_lone(tokens, False, wall_ms, times=times)

    def observe_plain_run(self, verify_ms: Sequence[float], wall_ms: Sequence[float]) -> None:
        """A run's plain steps (``plain_run``), one token each, by their times: those
        of a switch one by one (their sum is the switch's), the rest as their mean
        (those right after a prefill aside)."""
        skip = min(self._unsettled, len(wall_ms))
        self._unsettled -= skip
        verify_ms, wall_ms = verify_ms[skip:], wall_ms[skip:]
        k = min(len(wall_ms), max(SWITCH_STEPS - self._after, 0))  # each plain step counts 1 in _after
        for verify, wall in zip(verify_ms[:k], wall_ms[:k], strict=True):
            self.observe_step(1, verify, 0, 0.0, wall)
            self.observe_lone(1, False, wall)
        if (n := len(wall_ms) - k) > 0:
            verify, wall = sum(verify_ms[k:]) / n, sum(wall_ms[k:]) / n
            self.observe_step(1, verify, 0, 0.0, wall, n)
            self.observe_lone(1, False, wall, times=n)

    def drafting_loses(self) -> bool:
        """A lone sequence's recent drafting steps (probes aside) gave fewer tokens per
        ms than its plain steps, and at the model's costs the tokens they gave would
        have paid: the loss is in costs the model misses (on a compute-bound target
        even a whole accepted block can cost more than the plain steps it replaces;
        the switch back), and drafting does not pay whatever the model expects. Where
        those tokens lose at the model's costs too, their acceptance explains the loss:
        the acceptance estimates weigh that step by step (on the padded pair a veto
        set by the few drafting steps at a generation's start, where drafts keep less,
        held the pair off for whole generations in which a fixed draft of 2 gave
        1.3-1.4x the target alone)."""
        realized = self._realized()
        if realized is None or realized >= 1.0:
            return False
        return self.draft_modelled.value() * self.cost.step_ms(1, 0) >= 1.0

    def _realized(self) -> float | None:
        """Drafting steps' realized tokens per ms over plain steps', once both are known."""
        d, p = self.draft_rate, self.plain_rate
        if d.n < RATE_MIN or p.n < RATE_MIN or p.value() <= 0:
            return None
        return d.value() / p.value()

    def observe_step(
        self, rows: int, verify_ms: float, draft_rows: int, draft_ms: float, wall_ms: float, times: int = 1
    ) -> None:
        """The shared passes of one step and its wall time (the rest is overhead). The
        SWITCH_STEPS steps without a drafter pass after one with measure the switch instead:
        their excess over a plain step as modelled before them (once the model has seen
        SWITCH_STEPS plain steps). The first half of a switch's steps, slower for the
        switch's sake, and the first drafting step after plain ones (its deferred rows'
        injection, the graph rebuild) say nothing of the machine's speed; the
        PREFILL_STEPS steps after a prefill say nothing at all."""
        self._settling = self._unsettled > 0
        if self._settling:
            self._unsettled -= 1
            if draft_rows > 0:
                self._after, self._switch_sum = 0, 0.0
            self._switch_excess = 0.0
            return
        if (self._after == 0) if draft_rows > 0 else (self._after >= SWITCH_STEPS // 2):
            self.speed.observe(rows, draft_rows > 0, wall_ms, times)
        s = self.speed.value
        verify_ms, draft_ms, wall_ms = verify_ms / s, draft_ms / s, wall_ms / s
        self._switch_excess = 0.0
        if draft_rows > 0:
            self._after, self._switch_sum = 0, 0.0
            self.cost.observe(rows, verify_ms, draft_rows, draft_ms, wall_ms - verify_ms - draft_ms)
            return
        if self._after < SWITCH_STEPS:
            if self._after == 0 or rows != self._switch_base[0]:
                self._switch_base = (rows, self.cost.step_ms(rows, 0))
            excess = wall_ms - self._switch_base[1]
            self._switch_sum += excess
            if self._after == 0:  # the graph rebuild: charged to drafting in the realized rates
                self._switch_excess = min(max(excess, 0.0), wall_ms)
            self._after += 1
            # measured against a plain step the model knows: before it has seen SWITCH_STEPS of
            # them its plain overhead is still its optimistic 0, and each step's overhead counts
            # as switch (on the padded pair the first switch, in the bench's warm-up, read 15.9
            # ms against modelled plain steps of 11.2 ms that took ~12: the probes it spaced
            # missed the whole first generation, which stayed off)
            if self._after == SWITCH_STEPS and self.cost.plain_seen >= SWITCH_STEPS:
                last = self.switch_ms if self._switches else self._switch_sum  # the first sets it
                self.switch_ms = last + PROBE_ALPHA * (self._switch_sum - last)
                self._switches += 1
            return
        self.cost.observe(rows, verify_ms, draft_rows, draft_ms, wall_ms - verify_ms - draft_ms, times)
