"""Several sequences in one pair (``n_parallel``), run by the engine with
continuous batching: each sequence's output, and how many drafted tokens each
of its steps accepted, equal that sequence decoded alone, whatever else runs
beside it, joins or leaves (property tests over random schedules), on the
qwen3 target and on every hybrid rollback path. Bad input fails alone.

The tiny random models have logits of ~100, and llama.cpp's CPU kernels sum in
an order that depends on the batch and on how many KV cells the (unified) cache
spans: between a sequence alone and the same sequence beside seven others, a
logit moves by up to ~0.35 (measured: 0.05 between two batchings of one
sequence alone). So a greedy choice between two tokens closer than TIE_BOUND
can flip; a divergence is accepted only at such a measured near-tie, and the
comparison of that sequence stops there (test_near_tie_greedy.py explains the
same for one sequence). Sampling is compared exactly on the embedded pair,
whose logits are of ordinary size."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pydflash import ContextLimitError, GenerationInterrupted, Llama, PyDFlashError, embedded_pair
from support.models import HYBRID_TARGETS
from support.pairs import PAIRS, THREADS

N_CTX_SLOT = 256  # every slot's context, whatever n_parallel
TIE_BOUND = 1.0  # logits apart: at most 1% of their size here, ~3x the largest batching difference seen


def open_llm(target: Path, draft: Path | None, n_parallel: int, **kw) -> Llama:
    # accepted counts are compared with the sequence decoded alone: fixed draft lengths (the
    # adaptive ones follow timings and the other sequences; test_adaptive_draft.py covers them)
    kw.setdefault("draft_adaptive", False)
    return Llama(target, draft=draft, n_ctx=N_CTX_SLOT * n_parallel, n_parallel=n_parallel, n_threads=THREADS, **kw)


def random_jobs(rng: random.Random, n: int, n_vocab: int) -> list[dict]:
    """Prompts of different lengths (some sharing a prefix: slots' caches come into
    play), output lengths, draft lengths."""
    base = [rng.randrange(n_vocab) for _ in range(40)]
    jobs = []
    for _ in range(n):
        if rng.random() < 0.3:
            prompt = base[: rng.randint(1, 40)] + [rng.randrange(n_vocab) for _ in range(rng.randint(0, 8))]
        else:
            prompt = [rng.randrange(n_vocab) for _ in range(rng.randint(1, 90))]
        opts = {"max_tokens": rng.randint(1, 40), "ignore_eos": True}
        if rng.random() < 0.2:
            opts["draft_max"] = rng.randint(0, 7)
        jobs.append({"prompt": prompt, **opts})
    return jobs


Run = tuple[list[int], list[int], list[list[int]]]  # tokens, accepted drafts and the drafts, per step


def solo(llm: Llama, jobs: list[dict]) -> list[tuple[list[int], list[int], list[list[int]], list[float]]]:
    """Each job decoded alone, from an empty cache: tokens, accepted counts and drafts
    per step, and the margin between the top two logits at each token."""
    out = []
    for j in jobs:
        res = llm.generate(cache_prompt=False, logprobs=True, top_logprobs=2, **j)
        assert res.logprobs is not None
        margins = [lp.top[0][1] - lp.top[1][1] for lp in res.logprobs]
        out.append((res.tokens, *_steps(res), margins))
    return out


def _steps(res) -> tuple[list[int], list[list[int]]]:
    return [s.n_accepted for s in res.stats.steps], [list(s.drafted) for s in res.stats.steps]


def assert_same(got: list[Run], want: list[tuple[list[int], list[int], list[list[int]], list[float]]]) -> int:
    """Equal outputs and accepted counts, unless a sequence first differs at a
    near-tie of its reference (then its earlier tokens and steps must be equal).
    The same tokens may come from other drafts after the drafter's own near-tie (a
    drafter pass over several sequences' blocks sums in another order: seen once in
    ~340 schedules of 5): its steps up to the first draft that differs must be equal,
    and one sequence of a schedule at most may draft otherwise.
    Returns how many sequences stopped at a near-tie."""
    assert len(got) == len(want)
    ties = drafter_ties = 0
    for k, ((toks, acc, drafts), (ref, ref_acc, ref_drafts, margins)) in enumerate(zip(got, want, strict=True)):
        if toks == ref:
            if acc != ref_acc:
                i = next((i for i, (a, b) in enumerate(zip(drafts, ref_drafts, strict=False)) if a != b), None)
                assert i is not None, f"sequence {k}: same tokens and drafts, different accepted counts"
                assert acc[:i] == ref_acc[:i], f"sequence {k}: same drafts, different accepted counts"
                drafter_ties += 1
            continue
        i = next((i for i, (a, b) in enumerate(zip(toks, ref, strict=False)) if a != b), min(len(toks), len(ref)))
        assert i < min(len(toks), len(ref)), f"sequence {k}: {len(toks)} tokens, alone {len(ref)}"
        assert margins[i] < TIE_BOUND, f"sequence {k} differs at token {i}, where the top two are {margins[i]:.3f} apart"
        # steps that ended before token i were the same steps
        n = 0
        for a, b in zip(acc, ref_acc, strict=False):
            if n + b + 1 > i:
                break
            assert a == b, f"sequence {k}: a step before the near-tie accepted {a}, alone {b}"
            n += b + 1
        ties += 1
    assert drafter_ties <= 1, f"{drafter_ties} sequences drafted otherwise than alone, with the same tokens"
    return ties


def run_schedule(llm: Llama, jobs: list[dict], rng: random.Random) -> list[Run]:
    """Submit the jobs in waves: later ones join while earlier ones run (and
    some readers take a few steps first), all read to the end."""
    subs: list = []
    i = 0
    while i < len(jobs):
        wave = rng.randint(1, 3)
        for j in jobs[i : i + wave]:
            subs.append(llm.submit(**j))
        i += wave
        time.sleep(rng.choice([0.0, 0.001, 0.01]))
    results = [s.result() for s in subs]
    return [(r.tokens, *_steps(r)) for r in results]


@pytest.fixture(scope="module")
def alone(target_path: Path, model_dir: Path):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 1) as llm:
        yield llm


@pytest.mark.parametrize("n_parallel", [1, 2, 3, 8])
def test_each_sequence_equals_itself_decoded_alone(alone, target_path, model_dir, n_parallel):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", n_parallel) as llm:
        ties = 0
        for seed in range(3):
            rng = random.Random(1000 * n_parallel + seed)
            jobs = random_jobs(rng, n_parallel + 3, llm.n_vocab())
            ties += assert_same(run_schedule(llm, jobs, rng), solo(alone, jobs))
        print(f"n_parallel {n_parallel}: {ties} of {3 * (n_parallel + 3)} sequences stopped at a near-tie")


def test_the_target_alone_batches_too(target_path):
    with open_llm(target_path, None, 1) as one, open_llm(target_path, None, 4) as four:
        rng = random.Random(7)
        jobs = random_jobs(rng, 7, one.n_vocab())
        assert_same(run_schedule(four, jobs, rng), solo(one, jobs))


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_hybrid_targets_each_rollback_per_sequence(hybrid_models, name):
    arch, drafter, rollback, kind = PAIRS[name]
    target = hybrid_models / f"{arch}-target.gguf"
    draft = hybrid_models / f"{arch}-drafter-{drafter}.gguf"
    with open_llm(target, draft, 1, rollback=rollback) as one, open_llm(target, draft, 3, rollback=rollback) as three:
        assert three.rollback == kind
        rng = random.Random(hash(name) % 1000)
        jobs = random_jobs(rng, 5, one.n_vocab())
        assert_same(run_schedule(three, jobs, rng), solo(one, jobs))


def test_sampled_sequences_equal_themselves_alone(embedded_dflash):
    # each sequence draws from its own generator, seeded per request: batching changes nothing
    target, draft = embedded_pair()
    prompts = ["def parse(text):", "import os\n", "class Node:", "for key, value in", "while True:"]
    opts = {"max_tokens": 24, "ignore_eos": True, "temperature": 0.9, "top_k": 40}
    want = [embedded_dflash.generate(p, seed=100 + i, cache_prompt=False, **opts).tokens for i, p in enumerate(prompts)]
    with Llama(target, draft=draft, n_ctx=512 * 3, n_parallel=3) as llm:
        subs = [llm.submit(p, seed=100 + i, **opts) for i, p in enumerate(prompts)]
        assert [s.result().tokens for s in subs] == want


def test_hybrid_targets_were_all_covered():
    assert {p[0] for p in PAIRS.values()} == set(HYBRID_TARGETS)


def test_threads_and_asyncio_share_one_engine(alone, target_path, model_dir):
    prompts = [[5 + i, 9, 14 + 2 * i, 3] for i in range(6)]
    want = [alone.generate(p, max_tokens=24, ignore_eos=True).tokens for p in prompts]
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 4) as llm:
        got: dict[int, list[int]] = {}

        def work(i: int) -> None:
            got[i] = llm.generate(prompts[i], max_tokens=24, ignore_eos=True).tokens

        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()

        async def main() -> tuple[list[list[int]], int]:
            ticks = 0
            done = False

            async def ticker() -> None:  # the event loop keeps running while they generate
                nonlocal ticks
                while not done:
                    ticks += 1
                    await asyncio.sleep(0.001)

            tick = asyncio.create_task(ticker())

            async def one(i: int) -> list[int]:
                toks: list[int] = []
                async for step in llm.submit(prompts[i], max_tokens=24, ignore_eos=True):
                    toks += step.tokens
                return toks

            outs = await asyncio.gather(*(one(i) for i in range(3, 6)))
            done = True
            await tick
            return list(outs), ticks

        outs, ticks = asyncio.run(main())
        for t in threads:
            t.join(timeout=120)
        assert [got[i] for i in range(3)] + outs == want
        assert ticks > 5


def test_generate_batch_more_prompts_than_slots(alone, target_path, model_dir):
    prompts = ["def f(x):", "for i in", "class A:", [7, 8, 9], "import os", "x = "]
    want = [alone.generate(p, max_tokens=16, ignore_eos=True).tokens for p in prompts]
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        res = llm.generate_batch(prompts, max_tokens=16, ignore_eos=True)
        assert [r.tokens for r in res] == want
        assert all(r.stats.steps[0].n_batch_seqs >= 1 for r in res)
        assert max(s.n_batch_seqs for r in res for s in r.stats.steps) == 2  # they did share passes


def test_generate_batch_searches_every_prompts_stop_strings_as_it_runs(alone, target_path, model_dir):
    # the stop strings are searched on the reader's side: generate_batch reads every prompt's
    # steps as they come, so none runs on past its stop string while an earlier one is read
    prompts = ["def f(x):", "for i in"]
    full = [alone.generate(p, max_tokens=200, ignore_eos=True) for p in prompts]
    stop = next(full[1].text[k : k + 4] for k in range(10, 100) if full[1].text[k : k + 4] not in full[0].text)
    want = [alone.generate(p, max_tokens=200, ignore_eos=True, stop=[stop]) for p in prompts]
    assert want[0].finish_reason == "length" and want[1].finish_reason == "stop" and len(want[1].tokens) < 100
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        res = llm.generate_batch(prompts, max_tokens=200, ignore_eos=True, stop=[stop])
        assert [(r.tokens, r.text, r.finish_reason) for r in res] == [(r.tokens, r.text, r.finish_reason) for r in want]
        # the second stopped within a step or two of its stop string, not at max_tokens
        core = llm._engine._core
        assert min(core.n_past(i) for i in range(2)) < len(want[1].tokens) + 30
        # so are a submission's that nothing reads yet (the watcher's thread searches them)
        subs = [llm.submit(p, max_tokens=200, ignore_eos=True, stop=[stop], cache_prompt=False) for p in prompts]
        assert subs[0].result().tokens == want[0].tokens
        assert min(core.n_past(i) for i in range(2)) < len(want[1].tokens) + 30
        assert subs[1].done and subs[1].result().tokens == want[1].tokens
        streamed = [step for step in subs[1]]  # read after the end: nothing left, as after a loop
        assert streamed == []


def test_a_conversation_returns_to_its_slot(target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 3) as llm:
        turn1 = [3, 1, 4, 1, 5, 9, 2, 6] * 6
        first = llm.generate(turn1, max_tokens=20, ignore_eos=True)
        others = [llm.submit([20 + i] * 30, max_tokens=10, ignore_eos=True) for i in range(2)]
        turn2 = turn1 + first.tokens + [7, 7, 7]
        second = llm.generate(turn2, max_tokens=10, ignore_eos=True)
        for s in others:
            s.result()
        assert second.stats.cached_tokens == len(turn1) + len(first.tokens) - 1
        fresh = llm.generate(turn2, max_tokens=10, ignore_eos=True, cache_prompt=False)
        assert second.tokens == fresh.tokens
        assert [s.n_accepted for s in second.stats.steps] == [s.n_accepted for s in fresh.stats.steps]


def test_among_free_slots_the_longest_shared_prefix_wins(target_path, model_dir):
    # every slot free, and the conversation's is neither the least nor the most recently used
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 3) as llm:
        a, b, c = ([20 + i] * 30 for i in range(3))
        for prompt in (a, b, c):
            llm.generate(prompt, max_tokens=4, ignore_eos=True)
        assert [s["n_tokens"] for s in llm.slots()].count(0) == 0  # each slot holds one of them
        res = llm.generate([*b, 7, 7], max_tokens=4, ignore_eos=True)
        assert res.stats.cached_tokens >= len(b) - 1


def test_a_pinned_slot(target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        llm.generate([4, 4, 4, 4, 4, 4], max_tokens=8, ignore_eos=True, cache_prompt=False)
        a = llm.submit([4, 4, 4, 4, 4, 4, 1], max_tokens=4, ignore_eos=True, slot=1).result()
        assert a.stats.cached_tokens == 0  # slot 1 never held it
        with pytest.raises(ValueError, match="slot"):
            llm.submit([1, 2], slot=2)


# -- bad input fails alone ----------------------------------------------------------


def test_n_parallel_below_one_is_refused(target_path):
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n_parallel"):
            Llama(target_path, n_parallel=bad)
    with pytest.raises(ValueError, match="n_parallel"):
        Llama(target_path, n_ctx=64, n_parallel=16)  # 4 tokens each


def _running(llm: Llama, prompt: list[int], n: int):
    return llm.submit(prompt, max_tokens=n, ignore_eos=True)


def check_others_unaffected(alone: Llama, llm: Llama, disturb: Callable[[], None]) -> None:
    prompts = [[11, 12, 13], [21, 22, 23, 24], [31]]
    want = [alone.generate(p, max_tokens=30, ignore_eos=True).tokens for p in prompts]
    subs = [_running(llm, p, 30) for p in prompts]
    disturb()
    assert [s.result().tokens for s in subs] == want


def test_a_prompt_too_long_for_its_slot(alone, target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 4) as llm:

        def disturb() -> None:
            with pytest.raises(ContextLimitError, match="a sequence's context holds 256"):
                llm.submit([5] * 300)

        check_others_unaffected(alone, llm, disturb)


def test_an_abandoned_stream_and_a_cancelled_submission(alone, target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 4) as llm:

        def disturb() -> None:
            it = llm.stream([40, 41, 42], max_tokens=60, ignore_eos=True)
            next(it)
            it.close()  # left mid-way
            sub = _running(llm, [50, 51], 60)
            next(iter(sub))
            sub.cancel()
            with pytest.raises(GenerationInterrupted):
                sub.result()

        check_others_unaffected(alone, llm, disturb)


def test_submitting_after_close(target_path, model_dir):
    llm = open_llm(target_path, model_dir / "drafter-b8.gguf", 2)
    waiting = [_running(llm, [1, 2, 3], 200) for _ in range(4)]
    llm.close()
    for s in waiting:  # waiting or running: they end with an error, none hangs
        with pytest.raises(PyDFlashError):
            s.result()
    with pytest.raises(PyDFlashError, match="closed"):
        llm.submit([1, 2, 3])


def test_a_submission_read_in_parts(target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        sub = _running(llm, [1, 2, 3], 20)
        first = next(iter(sub))
        rest = list(sub)  # goes on where the first read stopped
        res = sub.result()
        assert first.tokens + sum((s.tokens for s in rest), []) == res.tokens and len(res.tokens) == 20
        assert sub.result() is not None and sub.done


def test_a_submission_whose_result_is_read_whole(alone, target_path, model_dir):
    want = alone.generate([1, 2, 3], max_tokens=20, ignore_eos=True).tokens
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        sub = _running(llm, [1, 2, 3], 20)
        assert sub.result().tokens == want and sub.done
        assert list(sub) == [] and sub.result().tokens == want  # read: nothing is left, nothing hangs

        async def rest() -> list:
            return [s async for s in sub]

        assert asyncio.run(rest()) == []
        # its error is kept, as when it is read by iterating
        bad = llm.submit([1, 2, 3], max_tokens=400, ignore_eos=True)
        bad.cancel()
        for _ in range(2):
            with pytest.raises(GenerationInterrupted):
                bad.result()


def test_an_awaited_result_wakes_the_event_loop_once(target_path, monkeypatch):
    # ``await aresult()`` with nothing iterated is woken at the end only, not for each step
    # (an event loop woken per step takes the GIL and a core from the engine's thread, as
    # generate() did); ``async for`` still gets each step
    from pydflash.engine import channel as _channel

    wakes: list[int] = []
    wake = _channel._wake

    def counted(fut) -> None:
        wakes.append(1)
        wake(fut)

    monkeypatch.setattr(_channel, "_wake", counted)
    with Llama(target_path, n_ctx=4096, n_threads=THREADS) as llm:
        want = llm.generate([1, 2, 3], max_tokens=400, ignore_eos=True).tokens

        async def whole() -> list[int]:
            return (await llm.submit([1, 2, 3], max_tokens=400, ignore_eos=True).aresult()).tokens

        assert asyncio.run(whole()) == want and len(wakes) <= 1

        async def steps() -> list[int]:
            return [t async for s in llm.submit([1, 2, 3], max_tokens=400, ignore_eos=True) for t in s.tokens]

        wakes.clear()
        assert asyncio.run(steps()) == want and len(wakes) > 1
        # a task that stops awaiting cancels its generation, as leaving an iteration does
        sub = llm.submit([1, 2, 3], max_tokens=4000, ignore_eos=True)

        async def left() -> None:
            task = asyncio.ensure_future(sub.aresult())
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(left())
        with pytest.raises(GenerationInterrupted):
            sub.result()
        assert llm.generate([1, 2, 3], max_tokens=400, ignore_eos=True).tokens == want


def test_interrupt_stops_every_running_sequence_and_the_object_stays_usable(alone, target_path, model_dir,
                                                                             monkeypatch):
    # the engine waits after its first step's output until the interrupt is issued, so both
    # sequences are mid-generation when it lands (no race with their 200 tokens)
    from pydflash.engine.engine import _Running

    issued = threading.Event()
    send = _Running.send

    def paused(self, steps=(), *a, **k) -> None:
        send(self, steps, *a, **k)
        if steps:
            issued.wait(60)  # a hang guard only

    monkeypatch.setattr(_Running, "send", paused)
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm:
        subs = [_running(llm, [1, 2, 3], 200), _running(llm, [4, 5], 200)]
        next(iter(subs[0]))
        llm.interrupt()
        issued.set()
        for s in subs:
            with pytest.raises(GenerationInterrupted):
                s.result()
        want = alone.generate([9, 8, 7], max_tokens=12, ignore_eos=True).tokens
        assert llm.generate([9, 8, 7], max_tokens=12, ignore_eos=True).tokens == want


# -- the server batches too -----------------------------------------------------------


def test_the_server_runs_requests_side_by_side(alone, target_path, model_dir):
    openai = pytest.importorskip("openai")
    from pydflash.server import Server

    prompts = [[60 + i, 61, 62] for i in range(3)]
    want = [alone.detokenize(alone.generate(p, max_tokens=20, ignore_eos=True).tokens).decode("utf-8", "replace")
            for p in prompts]
    with (
        open_llm(target_path, model_dir / "drafter-b8.gguf", 4) as llm,
        Server(llm, port=0) as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="x") as client,
    ):
        assert srv.parallel == 4
        # a long stream is running ...
        long = client.completions.create(model="m", prompt=[9, 9, 9], max_tokens=240, stream=True, temperature=0,
                                         extra_body={"ignore_eos": True})
        first = next(iter(long))
        assert first.choices[0].finish_reason is None
        # ... while three short ones finish, side by side with it and with each other
        with ThreadPoolExecutor(3) as ex:
            got = list(ex.map(lambda p: client.completions.create(
                model="m", prompt=p, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}), prompts))
        # ... before the long one's decode was over (one slot would queue them behind all of
        # it): its slot is still at work, short of its 240 tokens
        running = [s for s in llm.slots() if s["is_processing"]]
        assert [g.choices[0].text for g in got] == want
        assert len(running) == 1 and running[0]["n_tokens"] < 3 + 240 - 1, running
        last = list(long)[-1]
        assert last.choices[0].finish_reason == "length"


def test_a_waiting_generation_whose_caller_left_is_never_evaluated(target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 1) as llm:
        running = _running(llm, [1, 2, 3], 60)
        left = threading.Event()
        errors: list[BaseException] = []

        def waiting() -> None:
            try:
                llm.create_completion([7, 7, 7, 7], max_tokens=5, cancel=left.is_set)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=waiting)
        t.start()
        left.set()  # it leaves while the only slot is busy
        res = running.result()
        t.join(timeout=60)
        assert len(errors) == 1 and isinstance(errors[0], GenerationInterrupted)
        # the slot still holds the first generation: the second's prompt was never evaluated
        assert llm.pair.tokens == [1, 2, 3] + res.tokens


def test_a_queued_whole_reply_is_asked_to_cancel_only_once_it_is_admitted(target_path, model_dir):
    # a whole reply's reader sleeps and asks its cancel check now and then, but not while
    # it waits for a slot: the engine asks it first, as it admits it (the server's first
    # ask marks a request running)
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 1) as llm:
        running = _running(llm, [1, 2, 3], 60)
        next(iter(running))  # it holds the only slot
        asks: list[bool] = []
        t = threading.Thread(target=lambda: llm.create_completion(
            [7, 7, 7, 7], max_tokens=30, cancel=lambda: asks.append(running.done) or False))
        t.start()
        running.result()
        t.join(timeout=60)
        assert asks and asks[0] is True


def test_many_threads_cancelling_at_random(alone, target_path, model_dir):
    # 16 callers on 3 slots; a third of them leave at a random point: nothing hangs,
    # the ones that stay get their output alone
    rng = random.Random(11)
    jobs = [{"prompt": [rng.randrange(1, 300) for _ in range(rng.randint(1, 30))],
             "max_tokens": rng.randint(1, 50), "ignore_eos": True} for _ in range(16)]
    leave = [rng.random() < 0.33 for _ in jobs]
    after = [rng.randint(0, 3) for _ in jobs]
    want = [alone.generate(cache_prompt=False, **j).tokens for j in jobs]
    got: dict[int, list[int] | None] = {}
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 3) as llm:

        def work(i: int) -> None:
            sub = llm.submit(**jobs[i])
            toks: list[int] = []
            for k, step in enumerate(sub):
                toks += step.tokens
                if leave[i] and k >= after[i] and step.finish_reason is None:
                    sub.cancel()
                    got[i] = None
                    return
            got[i] = toks

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        stayed = [i for i in range(len(jobs)) if got[i] is not None]
        assert len(stayed) >= 5
        assert [got[i] for i in stayed] == [want[i] for i in stayed]
        # and the engine is idle and usable afterwards
        assert llm.generate([5, 5], max_tokens=4, ignore_eos=True).tokens == alone.generate(
            [5, 5], max_tokens=4, ignore_eos=True).tokens


def test_a_long_prompt_joins_in_chunks_between_the_running_steps(target_path, model_dir):
    # n_batch 64: a 900-token prompt takes 15 chunks, and the running stream steps between them
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=2 * 1024, n_parallel=2, n_batch=64,
               n_threads=THREADS) as llm:
        a = llm.submit([4, 8, 15, 16, 23, 42], max_tokens=600, ignore_eos=True)
        steps: list[int] = []  # a's steps with tokens, as its reader sees them (a counter, not a clock)
        stepping = threading.Event()

        def read_a() -> None:
            for step in a:
                if step.tokens:
                    steps.append(1)
                    stepping.set()

        reader = threading.Thread(target=read_a)
        reader.start()
        assert stepping.wait(timeout=120)
        at_join = len(steps)
        b = llm.submit([7] * 900, max_tokens=1, ignore_eos=True)
        next(iter(b))
        during = len(steps) - at_join
        reader.join(timeout=120)
        print("steps during the join:", during)
        assert during >= 5, f"the running stream made {during} steps while the long prompt was evaluated"
        assert b.result().stats.prefill_seconds > 0


# -- n choices ---------------------------------------------------------------------------


def test_n_choices_run_side_by_side(target_path, model_dir):
    with open_llm(target_path, model_dir / "drafter-b8.gguf", 3) as llm:
        opts = {"max_tokens": 12, "temperature": 0.9, "seed": 7}
        alone = [llm.create_completion([3, 4, 5], **dict(opts, seed=7 + i), ignore_eos=True) for i in range(3)]
        res = llm.create_completion([3, 4, 5], n=3, ignore_eos=True, **opts)
        assert [c["index"] for c in res["choices"]] == [0, 1, 2]
        assert [c["text"] for c in res["choices"]] == [a["choices"][0]["text"] for a in alone]
        assert res["usage"]["completion_tokens"] == 36 and res["usage"]["prompt_tokens"] == 3
        texts = {0: "", 1: "", 2: ""}
        for chunk in llm.create_completion([3, 4, 5], n=3, stream=True, ignore_eos=True, **opts):
            texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
        assert [texts[i] for i in range(3)] == [c["text"] for c in res["choices"]]
        # every choice's stop strings are searched as its steps come (not once it is read)
        stop = alone[1]["choices"][0]["text"][2:4] or "x"
        stopped = llm.create_completion([3, 4, 5], n=3, ignore_eos=True, stop=[stop], cancel=lambda: False, **opts)
        want = [
            llm.create_completion([3, 4, 5], **dict(opts, seed=7 + i), ignore_eos=True, stop=[stop])["choices"][0]
            for i in range(3)
        ]
        assert [(c["text"], c["finish_reason"]) for c in stopped["choices"]] == [
            (w["text"], w["finish_reason"]) for w in want
        ]
        assert stopped["choices"][1]["finish_reason"] == "stop"
        chat = llm.create_chat_completion([{"role": "user", "content": "hi"}], n=2, max_tokens=8, seed=1)
        assert [c["index"] for c in chat["choices"]] == [0, 1]
        with pytest.raises(ValueError, match="n must be"):
            llm.create_completion([3], n=0)
        # a stream left early stops every choice
        it = llm.create_completion([3, 4, 5], n=3, stream=True, max_tokens=200, ignore_eos=True)
        next(it)
        it.close()
        assert llm.generate([1, 2], max_tokens=3, ignore_eos=True).tokens


def test_n_choices_through_the_server(target_path, model_dir):
    openai = pytest.importorskip("openai")
    from pydflash.server import Server

    with (
        open_llm(target_path, model_dir / "drafter-b8.gguf", 2) as llm,
        Server(llm, port=0) as srv,
        openai.OpenAI(base_url=srv.url + "/v1", api_key="x") as client,
    ):
        res = client.completions.create(model="m", prompt=[3, 4, 5], max_tokens=8, n=2, temperature=0.8, seed=3)
        assert [c.index for c in res.choices] == [0, 1] and res.usage.completion_tokens <= 16
        got = {0: "", 1: ""}
        for chunk in client.completions.create(model="m", prompt=[3, 4, 5], max_tokens=8, n=2, temperature=0.8,
                                               seed=3, stream=True):
            got[chunk.choices[0].index] += chunk.choices[0].text
        assert [got[0], got[1]] == [c.text for c in res.choices]
