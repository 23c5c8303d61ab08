"""Today's engine side of the adaptive draft length (as of the layout commit), frozen
for the paired comparison in benchmarks/policy_ab.py: the methods of Engine that
talked to the old DraftPolicy, over the new Engine's others. Not part of the package."""

from __future__ import annotations

import time

from pydflash import _core
from pydflash.engine import engine as _engine
from pydflash.engine.engine import MODEL_SOURCES, _Slot
from pydflash.errors import PyDFlashError

from .policy import CONFIDENCE_CUT, CostModel, DraftPolicy, drafter_rows

CALIBRATION_REPS = 3
RUN_ALPHA = 0.25
_log = _engine._log


class LegacyEngine(_engine.Engine):
    """The engine as it drove the old policy."""

    def _release(self, slot: _Slot) -> None:
        if slot.draft is not None and self._policy is not None:
            self._policy.end_sequence(slot.draft)
        slot.gen = None
        slot.draft = None
        slot.prefilling = False
        slot.last_used = self._tick

    def _start(self, slot: _Slot) -> None:
        gen = slot.gen
        assert gen is not None
        defer = False  # the prompt's features wait for the drafter's next pass (none may come)
        if gen.adaptive and self._policy is not None:
            slot.draft = self._policy.new_sequence()
            defer = self._policy.starts_settled(slot.draft)
        try:
            self._pair.sequence(slot.seq).set_sampling_config(gen.config, gen.seed)
            gen.started(self._core.prefill_begin(slot.seq, gen.prompt, gen.config.cache_prompt, defer))
            self._prefilled()
            slot.prefilling = self._core.prefill_remaining(slot.seq) > 0
            if not slot.prefilling:
                gen.prefilled()
        except Exception as e:  # this prompt's own problem: the other sequences go on
            gen.fail(e)
            with self._cv:
                self._release(slot)

    def _prefill(self, slots: list[_Slot]) -> None:
        self._core.prefill_some([s.seq for s in slots], self._chunk)
        self._prefilled()
        for s in slots:
            if self._core.prefill_remaining(s.seq) == 0:
                s.prefilling = False
                assert s.gen is not None
                s.gen.prefilled()

    def _prefilled(self) -> None:
        # the steps after a prompt's batch are slower (llama.cpp's graph rebuild): not their kind's cost
        if self._policy is not None:
            self._policy.prefilled()

    def _make_policy(self) -> DraftPolicy:
        """The adaptive draft length's policy, its costs timed on an empty slot
        (a guess, corrected online, when every slot holds a cached prompt)."""
        core = self._core
        block = core.block_size or core.max_draft + 1  # an MTP head has no block: its longest draft + 1
        max_rows = max(1, min(core.n_seq * block, core.n_batch, core.n_ctx_seq))
        empty = [s.seq for s in self._slots if not s.reserved and not core.tokens(s.seq)]
        cost = CostModel.uncalibrated(max_rows)
        if empty:
            try:
                cal = core.calibrate(empty[0], max_rows, CALIBRATION_REPS)
                cost = CostModel.from_calibration(cal, max_rows)
                _log.debug("draft-length calibration: %d pass sizes in %.3f s", len(cal.verify_rows), cal.seconds)
            except PyDFlashError as e:  # the guess is corrected online; nothing else depends on it
                _log.warning("draft-length calibration failed (%s); starting from a guess", e)
        # the confidence cut: a DFlash drafter's probability of its token (DFlash2 and DSpark
        # measure confidence otherwise, and llama.cpp's MTP drafter takes none per step)
        cut = CONFIDENCE_CUT if core.drafter_kind == "dflash" else 0.0
        return DraftPolicy(cost, core.max_draft, core.draft_pass_rows, cut)

    def _step(self, slots: list[_Slot]) -> None:
        core = self._core
        t0 = time.perf_counter()
        n_ctx, default_dm = core.n_ctx_seq, core.default_draft_max
        stepping: list[_Slot] = []
        asked: list[int] = []  # -1: the pair's block; what the core caps and cuts to the budget
        caps: list[int] = []  # the longest draft each may keep: what the policy chooses within
        budgets: list[int] = []  # tokens each may still keep of any draft (llama.cpp's budget)
        for s in slots:
            gen = s.gen
            assert gen is not None
            dm = gen.next_draft_max(core.n_past(s.seq), n_ctx, default_dm)
            if dm is None:  # finished ("length")
                with self._cv:
                    self._release(s)
                continue
            stepping.append(s)
            budgets.append(gen.config.max_tokens - len(gen.tokens) - 1)
            asked.append(dm)
            caps.append(max(0, min(default_dm if dm < 0 else dm, budgets[-1])))
        if not stepping:
            return
        lengths = asked
        policy = self._policy
        lone = stepping[0].draft if len(stepping) == 1 else None
        n_run = self._run_max(stepping[0]) if len(stepping) == 1 else 1
        n_plain = policy.plain_run(lone, n_run) if policy is not None and lone is not None else 0
        plain = n_plain > 0
        if n_plain > 1 or (n_run > 1 and lone is None and caps[0] == 0):
            # alone, nothing to draft for a while (the policy's off, or no policy and no
            # length: a pinned draft_max=0 too), and a reader that waits for the end
            self._step_run(stepping[0], n_plain or n_run, budgets[0], t0)
            return
        if plain:
            # alone and off between weighings (most steps where drafting does not pay):
            # a plain step; only its costs are observed, below, as every step's are (the
            # weighing steps alone would be a biased sample: the first after a probe
            # rebuilds llama.cpp's graph)
            lengths = [0]
        elif policy is not None and any(s.draft is not None for s in stepping):
            floors = [s.gen.config.draft_min if s.gen is not None else 0 for s in stepping]
            chosen = policy.choose([s.draft for s in stepping], caps, floors)
            lengths = [k if s.draft is not None else a for s, k, a in zip(stepping, chosen, asked, strict=True)]
            if lone is not None and lengths == [0] and not lone.probing and n_run > 1:
                # weighed and off: the steps until the next weighing go with this one
                n_plain = 1 + policy.plain_run(lone, n_run - 1)
                if n_plain > 1:
                    self._step_run(stepping[0], n_plain, budgets[0], t0)
                    return
        steps = []
        for s, k, b in zip(stepping, lengths, budgets, strict=True):
            assert s.gen is not None
            p_min = s.gen.config.draft_p_min
            if s.draft is not None and p_min <= 0 and policy is not None:
                p_min = policy.cut  # a chosen length: the policy's cut too, unless the generation sets one
            steps.append(_core.SeqStep(s.seq, k, s.gen.config.draft_min, p_min, budget=b))
        results = core.step_batch(steps)
        for s, r in zip(stepping, results, strict=True):
            # n-gram drafts say nothing about the drafter's acceptance
            if not plain and policy is not None and s.draft is not None and not r.error and r.source in MODEL_SOURCES:
                policy.observe_sequence(s.draft, r.n_drafted, r.n_accepted, r.draft_max)
            self._take(s, r)
        if policy is None:
            return
        wall = (time.perf_counter() - t0) * 1e3
        first = results[0]
        if plain and first.n_drafted == 0 and not first.error:  # one row, no drafter pass: sampled
            policy.observe_plain(first.t_verify_ms, wall, len(first.tokens))
            return
        if plain:  # one sequence, no drafter pass (an n-gram draft): nothing to sum
            policy.observe_step(1 + first.n_drafted, first.t_verify_ms, 0, 0.0, wall)
        else:
            rows = sum(1 + r.n_drafted for r in results)
            draft_rows = sum(drafter_rows(r.draft_max, policy.pass_rows) for r in results if r.t_draft_ms > 0)
            t_draft = max(r.t_draft_ms for r in results)
            policy.observe_step(rows, first.t_verify_ms, draft_rows, t_draft, wall)
        # n-gram drafts' tokens say nothing of what the drafter's steps or plain steps give
        if lone is not None and not first.error and first.source in MODEL_SOURCES:
            policy.observe_lone(len(first.tokens), first.draft_max > 0, wall, probe=lone.probing, k=first.n_drafted)

    def _step_run(self, s: _Slot, n: int, budget: int, t0: float) -> None:
        """``n`` plain steps of one sequence in one call to the core: the engine's own
        work per step cost a small target ~10% of its plain step."""
        gen = s.gen
        assert gen is not None
        policy = self._policy
        st = s.draft if policy is not None else None  # before a release clears it
        step = _core.SeqStep(s.seq, 0, gen.config.draft_min, gen.config.draft_p_min, budget=budget)
        results = self._core.step_run(step, n, budget + 1, not gen.config.ignore_eos)
        if policy is not None and st is not None and len(results) < n:
            policy.unrun(st, n - len(results))  # the generation ended first: the policy counted them
        for r in results:
            if self._take(s, r):
                break
        wall = (time.perf_counter() - t0) * 1e3
        self._run_step_ms += RUN_ALPHA * (wall / len(results) - self._run_step_ms)
        if policy is not None and st is not None:
            # each step's time in the core, and the run's own (the engine's) shared out
            core = [r.t_step_ms for r in results]  # summed in C++: five attributes each cost ~35 us a run
            share = max(wall - sum(core), 0.0) / len(results)
            walls = [c + share for c in core]
            policy.observe_plain_run([r.t_verify_ms for r in results], walls)
