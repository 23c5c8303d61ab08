"""The engine: continuous batching of a ``Llama``'s generations.

One scheduler thread owns the core pair's ``n_parallel`` sequence slots. Each
iteration it admits waiting generations into free slots (the slot whose cached
tokens share the longest prefix with the prompt, else the least recently used
one: llama-server's choice), evaluates at most ``n_batch`` prompt tokens of the
slots still prefilling (one target pass, so a long prompt holds the running
streams up for one chunk at most), then advances every running slot by one
batched speculative step (one drafter pass, one target pass for all of them).
Generations join and leave between iterations; a consumer that leaves
cancels its own generation only.

The engine thread does no text work: it counts each request's tokens (EOS, the token
budget) and sends the raw step results into the request's channel (``channel.py``);
its reader's output processor (``generation.py``) makes text of them, searches the stop
strings and aborts the request (``RequestHandle.abort``) where one appears. A request
(``request.Request``) is immutable; what the engine keeps of it while it runs (its slot,
tokens counted, draft-length state, clock) is ``_Running``, its own.

The engine is the core pair's only owner: it makes it from the loaded models, and
everything above reaches it through the engine's named methods (a slot's save, load and
erase under ``hold``, the memory report, interrupt) or ``Engine.pair``, the public step
API over it. Closing the engine ends the thread and frees the pair.

The thread starts with the first submission and ends after a second with
nothing to do, so an idle ``Llama`` holds no thread."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator

from .. import _core
from ..config import ModelConfig
from ..draft_length.policy import CONFIDENCE_CUT, CostModel, DraftPolicy, Outcome, SequenceDraft
from ..errors import GenerationInterrupted, GrammarError, PyDFlashError, SlotBusyError
from ..fit import check_context_fits, explain_context_failure
from ..pair import ContextPair
from ..results import FinishReason, MemoryReport, MemoryRow
from .channel import Channel, Clock, EngineOutput, RequestHandle
from .request import Request

__all__ = ["Engine", "HeldSlot"]

IDLE_EXIT_S = 1.0  # an idle thread ends after this long; the next submission starts another
CALIBRATION_REPS = 3  # timed passes per size when the draft policy calibrates
# a run of plain steps in one call (Engine._step_run) takes about this long at most: a
# generation submitted meanwhile waits for it to join; a streamed one's tokens come in
# bursts of at most STREAM_RUN_MS (a 60 Hz display's frame)
RUN_MS = 20.0
STREAM_RUN_MS = 16.0
RUN_MAX_STEPS = 256
RUN_ALPHA = 0.25  # weight of each run's time per step in the estimate that sizes runs

_log = logging.getLogger("pydflash")


@dataclasses.dataclass(eq=False)
class _Running:
    """What the engine keeps of one request while it runs (its reader sees none of it)."""

    req: Request
    handle: RequestHandle
    n_tokens: int = 0  # tokens counted: before an EOS, within the budget
    clock: Clock = dataclasses.field(default_factory=Clock)
    processed: int = -1  # the last prompt-progress event's (a chunk that gave it none sends none)
    draft: SequenceDraft | None = None  # an adaptive request's draft-length state

    def send(
        self,
        steps: tuple[_core.StepResult, ...] = (),
        kept: tuple[int, ...] = (),
        finish: FinishReason | None = None,
        processed: int | None = None,
    ) -> None:
        if self.handle.cancelled:  # its reader left, or its output processor ended it
            return
        out = EngineOutput(self.clock, time.perf_counter(), steps, kept, finish, processed)
        self.handle.channel.put(out)

    def started(self, n_cached: int) -> None:
        """Admitted to a slot; ``n_cached`` prompt tokens came from its cache."""
        self.clock = Clock(t_start=time.perf_counter(), n_cached=n_cached)
        self._progress(n_cached)

    def prefill_progress(self, n_left: int) -> None:
        """A chunk of its prompt is evaluated; ``n_left`` tokens wait (the last one is
        evaluated with the first step)."""
        c = self.clock
        processed = len(self.req.prompt) - 1 - n_left
        prefill_s = time.perf_counter() - c.t_start
        self.clock = dataclasses.replace(c, prefill_s=prefill_s, n_prompt_done=max(processed - c.n_cached, 0))
        self._progress(processed)

    def prefilled(self) -> None:
        """Its prompt is evaluated (in chunks, between other sequences' steps)."""
        now, c = time.perf_counter(), self.clock
        n_done = len(self.req.prompt) - c.n_cached
        self.clock = dataclasses.replace(c, prefill_s=now - c.t_start, n_prompt_done=n_done, t_decode=now)
        self._progress(len(self.req.prompt))

    def _progress(self, processed: int) -> None:
        if self.req.progress and processed > self.processed:
            self.processed = processed
            self.send(processed=processed)

    def fail(self, exc: BaseException) -> None:
        self.handle.done = True
        self.handle.channel.put(exc)


@dataclasses.dataclass
class _Slot:
    seq: int
    run: _Running | None = None
    prefilling: bool = False
    last_used: int = 0
    reserved: bool = False  # under Engine.hold: no generation is admitted to it

    @property
    def draft(self) -> SequenceDraft | None:
        """Its request's draft-length state (None: its draft length is not chosen)."""
        return None if self.run is None else self.run.draft


class HeldSlot:
    """One sequence slot while ``Engine.hold`` keeps generations off it: its tokens, its
    state to and from a slot file, its erasure, and the step API at it (``pair``). Usable
    inside its ``with`` block only."""

    def __init__(self, core: _core.ContextPair, pair: ContextPair):
        self._core = core
        self.pair = pair  # the step API at this sequence
        self.seq = pair.seq
        self.held = True  # cleared when the hold ends

    def _open(self) -> _core.ContextPair:
        if not self.held:
            raise PyDFlashError(f"slot {self.seq} is no longer held")
        return self._core

    def tokens(self) -> list[int]:
        """The tokens the slot holds (its prompt cache)."""
        return list(self._open().tokens(self.seq))

    def save(self, path: str) -> None:
        """Its tokens and both contexts' memory of them into the slot file ``path``."""
        self._open().save_sequence(self.seq, path)

    def load(self, path: str) -> None:
        """Replace it with the slot file ``path`` (ValueError for another model or settings)."""
        self._open().load_sequence(self.seq, path)

    def erase(self) -> int:
        """Forget its tokens (both contexts); how many it held."""
        core = self._open()
        n = len(core.tokens(self.seq))
        core.reset(self.seq)
        return n


class Engine:
    """Runs every generation of one core pair (see the module docstring).
    ``submit``/``cancel``/``close`` and the slot methods may be called from any thread."""

    def __init__(self, target: _core.Model, draft: _core.Model | None, config: ModelConfig):
        """The core pair of ``target`` and ``draft`` (None: none) with ``config``'s contexts;
        ContextLimitError and the like, explained, where they do not fit."""
        check_context_fits(target, config)
        try:
            core = _core.ContextPair(target, draft, config.pair_params())
        except PyDFlashError as e:
            raise explain_context_failure(e, target, config) from e
        self._core = core
        # the end-of-generation ids, not the model: a model an engine held would outlive
        # close() (the finalizer holds the engine), and a model on an RPC server must be
        # freed while that server is still there
        self._eog = frozenset(target.eog_tokens())
        self.pair = ContextPair(core)  # the step API over it, for direct calls
        self._chunk = core.n_batch  # prompt tokens evaluated per iteration
        self._slots = [_Slot(i) for i in range(core.n_seq)]
        self._queue: collections.deque[_Running] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._tick = 0  # iteration count: slots' last use, for LRU
        self._aborting = False  # a cancel interrupted its lone generation's decode
        self._policy: DraftPolicy | None = None  # made (calibrated) before the first adaptive generation
        self._pooled = False  # this thread computed since it last released its OpenMP pool
        self._run_step_ms: dict[int, float] = {}  # a step's time in runs (_step_run) by sequences, averaged

    # -- any thread --------------------------------------------------------------

    def submit(
        self, request: Request, quiet: bool = False, cancel_check: Callable[[], bool] | None = None
    ) -> RequestHandle:
        """Queue ``request`` (a free slot, else its turn); its outputs go to the handle's
        channel (``quiet``: its reader is woken at the end only). ``cancel_check`` is
        asked once, as it is admitted: True drops it before its prompt is evaluated."""
        # the submitting thread now waits on the engine's: an OpenMP pool it holds
        # from direct pair calls (pair.score on the main thread) would slow every
        # graph the engine computes (threads.h); it gets a new one if it computes again
        _core.release_compute_threads()
        with self._cv:
            if self._closed:
                raise PyDFlashError("this Llama object is closed")
            handle = RequestHandle(Channel(quiet), self.cancel, cancel_check)
            self._queue.append(_Running(request, handle))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pydflash-engine", daemon=True)
                self._thread.start()
            self._cv.notify()
        return handle

    def cancel(self, handle: RequestHandle, interrupt: bool = True) -> None:
        """Drop a request between steps; ``interrupt``: abort its decode now where it runs
        alone (its reader left), not where its output processor ended it (a stop string:
        its sequence's cache stays)."""
        with self._cv:
            handle.cancelled = True
            active = [s.run.handle for s in self._slots if s.run is not None]
            if interrupt and active == [handle]:
                # alone in the pair: abort its decode now (a long prefill) rather than
                # after it; aborting resets the caches, which no other sequence is using
                self._aborting = True
                self._core.interrupt()
            self._cv.notify()

    def close(self, free: bool = True) -> None:
        """Stop the thread (waiting and running generations fail with PyDFlashError),
        then free the pair, which the engine owns (``free`` False: left to its destructor,
        for a ``ContextPair`` its owner's caller may still hold)."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            busy = any(s.run is not None for s in self._slots)
            self._cv.notify()
        on_thread = thread is threading.current_thread()
        if thread is not None and not on_thread:
            if busy:
                self._core.interrupt()
            thread.join()
        self._core.clear_interrupt()
        with self._cv:
            self._fail_all_locked(PyDFlashError("this Llama object was closed"))
        if free and not on_thread:  # (from its own thread: it ends after this iteration)
            self._core.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called (the pair is freed, or being freed)."""
        return self._closed

    def interrupt(self) -> None:
        """Abort the running decode: every generation in it raises GenerationInterrupted
        and the caches are reset (``Llama.interrupt``). Nothing once closed."""
        if not self._closed:
            self._core.interrupt()

    def memory(self) -> MemoryReport:
        """llama.cpp's memory breakdown of both contexts."""
        return MemoryReport(tuple(MemoryRow(*row) for row in self._core.memory()), self._core.n_seq)

    @contextlib.contextmanager
    def hold(self, seq: int) -> Iterator[HeldSlot]:
        """Keep generations off slot ``seq`` while the block works on it (its tokens, a
        save, a load, sequence 0's eval/sample); SlotBusyError when a generation is
        using it or another hold has it."""
        with self._cv:
            if self._closed:
                raise PyDFlashError("this Llama object is closed")
            slot = self._slots[seq]
            if slot.run is not None or slot.reserved:
                raise SlotBusyError(f"slot {seq} is busy")
            slot.reserved = True
        held = HeldSlot(self._core, self.pair.sequence(seq))
        try:
            yield held
        finally:
            held.held = False
            _core.release_compute_threads()  # a slot save may have run the drafter here
            with self._cv:
                slot.reserved = False
                self._cv.notify()

    def save_slot(self, seq: int, path: str) -> None:
        """Slot ``seq``'s state into the slot file ``path`` (SlotBusyError while in use)."""
        with self.hold(seq) as slot:
            slot.save(path)

    def load_slot(self, seq: int, path: str) -> None:
        """Slot ``seq`` from the slot file ``path`` (SlotBusyError while in use)."""
        with self.hold(seq) as slot:
            slot.load(path)

    def erase_slot(self, seq: int) -> int:
        """Forget slot ``seq``'s tokens; how many it held (SlotBusyError while in use)."""
        with self.hold(seq) as slot:
            return slot.erase()

    def slot_tokens(self, seq: int) -> list[int]:
        """The tokens slot ``seq`` holds now, held or not (a listing's snapshot)."""
        return list(self._core.tokens(seq))

    def busy_slots(self) -> set[int]:
        """The slots a generation or a hold is using."""
        with self._cv:
            return {s.seq for s in self._slots if s.run is not None or s.reserved}

    # -- the engine thread --------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._iteration():
                pass
        except BaseException as e:  # a bug here must not leave consumers waiting forever
            with self._cv:
                self._thread = None
                self._fail_all_locked(PyDFlashError(f"the generation engine failed: {e!r}"))
            raise

    def _iteration(self) -> bool:
        with self._cv:
            while True:
                if self._closed:
                    self._thread = None
                    self._fail_all_locked(PyDFlashError("this Llama object was closed"))
                    return False
                self._release_cancelled_locked()
                starts = self._admit_locked()
                if any(s.run is not None for s in self._slots):
                    break
                if self._pooled:
                    # idle: hand back ggml's OpenMP workers (threads.h: a pool another
                    # Llama or thread would see makes every graph's barriers sleep)
                    _core.release_compute_threads()
                    self._pooled = False
                if not self._cv.wait(timeout=IDLE_EXIT_S) and not self._queue:
                    self._thread = None
                    return False
            if self._aborting:
                # its generation is gone; an interrupt no decode consumed must not hit the next
                self._core.clear_interrupt()
                self._aborting = False
            self._tick += 1
            self._pooled = True
        if self._policy is None and any(s.run is not None and s.run.req.adaptive for s in starts):
            self._policy = self._make_policy()
        for slot in starts:
            self._start(slot)
        try:
            live = [s for s in self._slots if s.run is not None and not s.run.handle.cancelled]
            prefilling = [s for s in live if s.prefilling]
            if prefilling:
                self._prefill(prefilling)
            running = [s for s in live if s.run is not None and not s.prefilling]
            if running:
                self._step(running)
        except Exception as e:
            # a failed decode or rollback resets the whole pair: every sequence in it fails
            with self._cv:
                for s in self._slots:
                    if s.run is not None:
                        s.run.fail(_copy(e))
                        self._release(s)
        return True

    def _release(self, slot: _Slot) -> None:
        if slot.run is not None:
            slot.run.handle.done = True
        slot.run = None
        slot.prefilling = False
        slot.last_used = self._tick

    def _release_cancelled_locked(self) -> None:
        for s in self._slots:
            if s.run is not None and (s.run.handle.cancelled or s.run.handle.done):
                self._release(s)
        if any(r.handle.cancelled for r in self._queue):
            for r in self._queue:
                r.handle.done = r.handle.done or r.handle.cancelled
            self._queue = collections.deque(r for r in self._queue if not r.handle.cancelled)

    def _fail_all_locked(self, exc: PyDFlashError) -> None:
        for s in self._slots:
            if s.run is not None:
                s.run.fail(_copy(exc))
                self._release(s)
        while self._queue:
            self._queue.popleft().fail(_copy(exc))

    def _admit_locked(self) -> list[_Slot]:
        """Waiting generations into free slots, in order (one pinned to a busy slot waits)."""
        starts: list[_Slot] = []
        waiting: collections.deque[_Running] = collections.deque()
        while self._queue:
            run = self._queue.popleft()
            free = [s for s in self._slots if s.run is None and not s.reserved]
            if run.req.slot is not None:
                free = [s for s in free if s.seq == run.req.slot]
            if not free:
                waiting.append(run)
                continue
            # asked once, as it would start: its caller left while it waited, so no prefill
            handle = run.handle
            if handle.cancel_check is not None and handle.cancel_check():
                handle.cancelled = handle.done = True
                handle.channel.put(GenerationInterrupted("the generation was cancelled"))
                continue
            slot = self._choose(free, run.req)
            slot.run = run
            handle.admitted = True
            starts.append(slot)
        self._queue = waiting
        return starts

    def _choose(self, free: list[_Slot], req: Request) -> _Slot:
        """The free slot whose cached tokens share the longest prefix with the
        prompt (least recently used among equals)."""
        if not req.config.cache_prompt:
            return min(free, key=lambda s: s.last_used)

        def common(s: _Slot) -> int:
            held = self._core.tokens(s.seq)
            n = 0
            for a, b in zip(held, req.prompt, strict=False):
                if a != b:
                    break
                n += 1
            return n

        return max(free, key=lambda s: (common(s), -s.last_used))

    def _start(self, slot: _Slot) -> None:
        run = slot.run
        assert run is not None
        req = run.req
        if req.adaptive and self._policy is not None:
            run.draft = self._policy.new_sequence()
        # a sequence that starts off leaves its prompt's features waiting, as plain steps do
        defer = run.draft is not None and run.draft.quiet > 0
        try:
            self.pair.sequence(slot.seq).set_sampling_config(req.config, req.seed)
            run.started(self._core.prefill_begin(slot.seq, list(req.prompt), req.config.cache_prompt, defer))
            slot.prefilling = self._core.prefill_remaining(slot.seq) > 0
            if not slot.prefilling:
                run.prefilled()
        except Exception as e:  # this prompt's own problem: the other sequences go on
            run.fail(e)
            with self._cv:
                self._release(slot)

    def _prefill(self, slots: list[_Slot]) -> None:
        self._core.prefill_some([s.seq for s in slots], self._chunk)
        for s in slots:
            assert s.run is not None
            left = self._core.prefill_remaining(s.seq)
            if left == 0:
                s.prefilling = False
                s.run.prefilled()
            else:
                s.run.prefill_progress(left)

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
            run = s.run
            assert run is not None
            dm = _next_draft_max(run, core.n_past(s.seq), n_ctx)
            if dm is None:  # finished ("length")
                run.send(finish="length")
                with self._cv:
                    self._release(s)
                continue
            stepping.append(s)
            budgets.append(run.req.max_tokens - run.n_tokens - 1)
            asked.append(dm)
            caps.append(max(0, min(default_dm if dm < 0 else dm, budgets[-1])))
        if not stepping:
            return
        policy = self._policy
        drafts = [s.draft for s in stepping]  # before a generation's end clears its slot
        lengths = asked
        if policy is not None and any(d is not None for d in drafts):
            floors = [s.run.req.config.draft_min if s.run is not None else 0 for s in stepping]
            chosen = policy.choose(drafts, caps, floors)
            lengths = [k if d is not None else a for d, k, a in zip(drafts, chosen, asked, strict=True)]
        # nothing to draft for a while (the policy's off, or a pinned 0) and readers that
        # can wait for a few steps: several plain steps in one call
        n = RUN_MAX_STEPS
        for d, k, cap in zip(drafts, lengths, caps, strict=True):
            if d is not None:
                n = min(n, d.quiet if k == 0 else 1)
            elif cap != 0:
                n = 1
        if n > 1 and (n := min(n, self._run_max(stepping))) > 1:
            self._step_run(stepping, n, budgets, t0)
            return
        steps = []
        for s, k, b in zip(stepping, lengths, budgets, strict=True):
            assert s.run is not None
            cfg = s.run.req.config
            p_min = cfg.draft_p_min
            if s.draft is not None and p_min <= 0 and policy is not None:
                p_min = policy.cut  # a chosen length: the policy's cut too, unless the generation sets one
            steps.append(_core.SeqStep(s.seq, k, cfg.draft_min, p_min, budget=b))
        results = core.step_batch(steps)
        for s, r in zip(stepping, results, strict=True):
            self._take(s, [r])
        wall = (time.perf_counter() - t0) * 1e3
        # the first plain step of this many sequences sizes their first run
        if len(stepping) not in self._run_step_ms and not any(r.n_drafted for r in results):
            self._run_step_ms[len(stepping)] = wall
        if policy is not None:
            # n-gram drafts say nothing about the drafter's acceptance
            out = [
                Outcome(r.draft_max, r.n_drafted, r.n_accepted, not r.error and r.source in MODEL_SOURCES)
                for r in results
            ]
            policy.observe(drafts, out, results[0].t_verify_ms, max(r.t_draft_ms for r in results), wall)

    def _run_max(self, slots: list[_Slot]) -> int:
        """The steps these sequences may take in one call (``_step_run``): 1 where a stop
        string must be searched after each step, a generation waits to join or is still
        reading its prompt, or one has no token yet (its first comes alone); else as many as
        take about RUN_MS (STREAM_RUN_MS where a reader follows the steps)."""
        runs = [s.run for s in slots if s.run is not None]
        waiting = self._queue or any(s.prefilling for s in self._slots)
        if waiting or any(r.req.stop or not r.n_tokens for r in runs):
            return 1
        budget = RUN_MS if all(r.handle.channel.quiet for r in runs) else STREAM_RUN_MS
        # at least 2: only runs measure a run's step (2 where no step of this many sequences
        # was timed yet), and one slow run must not end runs for good
        step_ms = self._run_step_ms.get(len(slots), budget / 2)
        return max(2, min(RUN_MAX_STEPS, int(budget / step_ms)))

    def _take(self, s: _Slot, results: list[_core.StepResult]) -> bool:
        """A step's (or a run's) results to its reader, as one output: its tokens counted
        up to an EOS and within the budget; True (its slot freed) where that ended it."""
        run = s.run
        assert run is not None
        steps: list[_core.StepResult] = []
        kept: list[int] = []
        finish: FinishReason | None = None
        for r in results:
            if r.error:
                if steps:  # what came before it
                    run.send(tuple(steps), tuple(kept))
                run.fail(GrammarError(r.error))
                break
            k, finish = self._count(run, r)
            run.n_tokens += k
            steps.append(r)
            kept.append(k)
            if finish is not None:
                run.send(tuple(steps), tuple(kept), finish)
                break
        else:
            run.send(tuple(steps), tuple(kept))
        if finish is None and not run.handle.done:
            return False
        with self._cv:
            self._release(s)
        return True

    def _count(self, run: _Running, r: _core.StepResult) -> tuple[int, FinishReason | None]:
        """How many of a step's tokens count (before an EOS, within the budget), and the
        finish reason where they end it."""
        eos = not run.req.config.ignore_eos
        for i, t in enumerate(r.tokens):
            if eos and t in self._eog:
                return i, "eos"
            if run.n_tokens + i + 1 >= run.req.max_tokens:
                return i + 1, "length"
        return len(r.tokens), None

    def _step_run(self, slots: list[_Slot], n: int, budgets: list[int], t0: float) -> None:
        """``n`` plain steps of these sequences in one call to the core: the engine's own
        work per step is a sizable share of a small target's plain step; a reader gets
        each run's tokens at once."""
        drafts = [s.draft for s in slots]  # before a release clears them
        steps, eog = [], False
        for s, b in zip(slots, budgets, strict=True):
            assert s.run is not None
            cfg = s.run.req.config
            steps.append(_core.SeqStep(s.seq, 0, cfg.draft_min, cfg.draft_p_min, budget=b))
            eog = eog or not cfg.ignore_eos
        runs = self._core.step_runs(steps, n, [b + 1 for b in budgets], eog)
        for s, results in zip(slots, runs, strict=True):
            if results:
                self._take(s, list(results))
        wall = (time.perf_counter() - t0) * 1e3
        longest = max(runs, key=len)
        n, k = len(longest), len(slots)
        seen = self._run_step_ms.get(k, wall / n)
        self._run_step_ms[k] = seen + RUN_ALPHA * (wall / n - seen)
        if self._policy is not None:
            verify = sum(r.t_verify_ms for r in longest) / n
            self._policy.observe(drafts, [Outcome(0, 0, 0)] * k, verify, 0.0, wall / n, n)


def _next_draft_max(run: _Running, n_past: int, n_ctx: int) -> int | None:
    """This step's draft_max (-1: the pair's block), or None where the request ends
    here ("length": its budget spent, or its sequence's context full)."""
    remaining = run.req.max_tokens - run.n_tokens
    if remaining <= 0 or n_past >= n_ctx:
        return None
    if remaining == 1:  # one token left: no draft could be kept
        return 0
    # the block length asked of the drafter (None: the pair's default); what is
    # kept of any draft is cut to the tokens left (the step's budget)
    dm = run.req.config.draft_max
    return -1 if dm is None else dm


MODEL_SOURCES = ("draft-dflash", "draft-dspark", "draft-mtp", "")  # "": nothing drafted this step


def _copy(exc: BaseException) -> BaseException:
    """The same error for another consumer (one exception object raised in several
    threads would share its traceback)."""
    try:
        return type(exc)(*exc.args)
    except Exception:
        return PyDFlashError(str(exc))
