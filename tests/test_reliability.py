"""Interrupts, concurrency, lifetimes and leaks: nothing crashes, nothing leaks,
the object stays usable."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pydflash import GenerationInterrupted, Llama
from support.long_prefill import MIN_PREFILL, PROBE, PrefillWatch, long_prompt, tokens_for


@pytest.fixture(scope="module")
def long_n(target_path, model_dir) -> int:
    # size the workload from this machine's measured prefill rate (a fast CPU or
    # a GPU prefills a fixed 8000 tokens in less than the timer's 50 ms)
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=PROBE + 64, n_batch=2048) as llm:
        llm.pair.prefill(long_prompt(PROBE))  # warm-up
        t0 = time.perf_counter()
        llm.pair.prefill(long_prompt(PROBE))
        rate = PROBE / (time.perf_counter() - t0)
    n = tokens_for(MIN_PREFILL, rate)
    print(f"prefill rate {rate:.0f} tokens/s: {n} prompt tokens")
    return n


@pytest.fixture(scope="module")
def big(target_path, model_dir, long_n):
    # the prompt is evaluated in two chunks: the first one's end is the event that the
    # prefill is under way, and the interrupt must stop the second one midway
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=long_n + 64, n_batch=long_n // 2) as llm:
        yield llm


@pytest.fixture
def python_sigint():
    """Python's own Ctrl-C handler for the test. A background job of a
    non-interactive shell (how CI may start us) begins with SIGINT ignored, and
    Python then leaves it ignored: no Ctrl-C reaches the process at all."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def sigint_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def assert_stopped_in_the_second_chunk(watch: PrefillWatch, long_n: int) -> None:
    # the first chunk (half the prompt) was evaluated, the second was not: the decode in
    # flight stopped, which it does only if the interrupt is honoured within it
    assert len(watch.processed) == 1 and 0 < watch.processed[0] < long_n - 1, watch.processed
    assert not watch.completed, "the prefill ran to its end"


def test_ctrl_c_stops_a_long_prefill(big, long_n, python_sigint):
    with PrefillWatch(long_n) as watch:
        sender = watch.then(sigint_self)
        with pytest.raises(KeyboardInterrupt):
            big.generate(long_prompt(long_n), max_tokens=4, cache_prompt=False)
        sender.join()
        # usable, and correct, afterwards (the engine finished the interrupted request first)
        ref = big.generate("def f():", max_tokens=20, ignore_eos=True, draft_max=0).tokens
        assert big.generate("def f():", max_tokens=20, ignore_eos=True).tokens == ref
    assert_stopped_in_the_second_chunk(watch, long_n)


def test_a_sigint_handler_that_does_not_raise_lets_the_work_finish(big, long_n):
    # Python runs the handler; only an exception from it stops the prefill
    calls: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with PrefillWatch(long_n) as watch:
            sender = watch.then(sigint_self)
            out = big.generate(long_prompt(long_n), max_tokens=4, ignore_eos=True, cache_prompt=False)
            sender.join()
    finally:
        signal.signal(signal.SIGINT, old)
    assert calls == [signal.SIGINT]
    assert len(watch.processed) == 1 and watch.completed  # the signal came mid-prefill, which went on
    assert len(out.tokens) == 4 and out.finish_reason == "length"


CTRL_C_AFTER_THREAD_IMPORT = """
import json, os, signal, sys, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)
t = threading.Thread(target=lambda: __import__("pydflash"))
t.start(); t.join()
from pydflash import Llama
from support.long_prefill import MIN_PREFILL, PROBE, PrefillWatch, long_prompt, tokens_for
with Llama(sys.argv[1], n_ctx=PROBE + 64, n_batch=2048) as llm:  # size the workload: this process's rate
    llm.pair.prefill(long_prompt(PROBE))
    t0 = time.perf_counter(); llm.pair.prefill(long_prompt(PROBE)); rate = PROBE / (time.perf_counter() - t0)
n = tokens_for(MIN_PREFILL, rate)
with Llama(sys.argv[1], n_ctx=n + 64, n_batch=n // 2) as llm, PrefillWatch(n) as watch:
    sender = watch.then(lambda: os.kill(os.getpid(), signal.SIGINT))
    word = "finished"
    try:
        llm.generate(long_prompt(n), max_tokens=4, cache_prompt=False)
    except KeyboardInterrupt:
        word = "interrupted"
    sender.join()
    after = len(llm.generate("ok", max_tokens=3, ignore_eos=True).tokens)
print(json.dumps({"word": word, "n": n, "processed": watch.processed, "completed": watch.completed, "after": after}))
"""


def test_ctrl_c_works_when_a_worker_thread_imported_pydflash_first(target_path):
    # Python's main thread runs signal handlers, whichever thread loaded the extension
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                    os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", CTRL_C_AFTER_THREAD_IMPORT, str(target_path)],
                         capture_output=True, text=True, timeout=300, env=env)  # a hang guard
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert (got["word"], got["after"]) == ("interrupted", 3), got
    watch = PrefillWatch(got["n"])
    watch.processed, watch.completed = got["processed"], got["completed"]
    assert_stopped_in_the_second_chunk(watch, got["n"])


def test_interrupt_from_another_thread(big, long_n):
    with PrefillWatch(long_n) as watch:
        sender = watch.then(big.interrupt)
        with pytest.raises(GenerationInterrupted, match="interrupted"):
            big.generate(long_prompt(long_n), max_tokens=4, cache_prompt=False)
        sender.join()
        assert len(big.generate("ok", max_tokens=5, ignore_eos=True).tokens) == 5
    assert_stopped_in_the_second_chunk(watch, long_n)


def test_two_objects_decode_concurrently(target_path, model_dir, long_n):
    # one long C++ call per thread: with the GIL held the second could not start before the
    # first ended. Each thread notes its start and its end (an order, not times): the calls
    # release the GIL, so both start before either ends. A long switch interval keeps a
    # thread that runs Python from being preempted between its note and its call.
    with Llama(target_path, n_ctx=long_n + 64, n_batch=2048, n_threads=1) as a, \
            Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=long_n + 64, n_batch=2048, n_threads=1) as b:
        tokens = long_prompt(long_n)
        marks: list[str] = []
        together = threading.Barrier(2)

        def work(name: str, llm: Llama) -> None:
            together.wait(timeout=120)
            marks.append(f"{name} starts")
            llm.pair.score(tokens)
            marks.append(f"{name} ends")

        threads = [threading.Thread(target=work, args=(n, m)) for n, m in (("a", a), ("b", b))]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(30.0)
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)  # a hang guard
        finally:
            sys.setswitchinterval(interval)
        assert len(marks) == 4 and sorted(marks[:2]) == ["a starts", "b starts"], marks


def test_abandoned_stream_leaves_object_usable(dflash_b8):
    want = dflash_b8.generate("abc", max_tokens=30, ignore_eos=True).tokens
    it = dflash_b8.stream("zzz", max_tokens=50, ignore_eos=True)
    next(it)
    del it
    gc.collect()
    assert dflash_b8.generate("abc", max_tokens=30, ignore_eos=True).tokens == want
    it = dflash_b8.stream("zzz", max_tokens=50, ignore_eos=True)
    next(it)
    it.close()
    assert dflash_b8.generate("abc", max_tokens=30, ignore_eos=True).tokens == want


def test_objects_can_be_freed_in_any_order(target_path, model_dir):
    llm = Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=128)
    pair = llm.pair
    pair.prefill([1, 2, 3])
    del llm  # the pair keeps its contexts and models alive
    gc.collect()
    assert len(pair.step().tokens) >= 1
    del pair
    gc.collect()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_create_generate_close_cycles_do_not_leak(target_path, model_dir):
    def cycle() -> None:
        with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256) as llm:
            llm.generate("leak?", max_tokens=8, ignore_eos=True)

    for _ in range(20):  # warm-up: allocator pools, lazy init
        cycle()
    gc.collect()
    before = rss_mb()
    for _ in range(200):
        cycle()
    gc.collect()
    growth = rss_mb() - before
    assert growth < 20, f"RSS grew by {growth:.1f} MiB over 200 cycles"


def test_utf8_split_across_tokens_is_held_back():
    # the byte tokens of a 4-byte character arrive one by one: nothing is
    # released until the character is complete
    from pydflash.engine.text import TextAssembler

    asm = TextAssembler(lambda t: bytes([t]), ())
    pieces = []
    for b in list("🙂".encode()) + [ord("!")]:
        asm.add(b)
        pieces.append(asm.release(final=False))
    assert pieces == [("", 0), ("", 0), ("", 0), ("🙂", 4), ("!", 1)]


def test_stream_text_equals_generate_text_with_multibyte_output(dflash_b8):
    prompt = "naïve café 🙂 — ünïcödé"
    res = dflash_b8.generate(prompt, max_tokens=60, ignore_eos=True)
    streamed = list(dflash_b8.stream(prompt, max_tokens=60, ignore_eos=True))
    assert "".join(s.text for s in streamed) == res.text
