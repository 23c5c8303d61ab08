"""No idle thread keeps ggml's OpenMP workers (csrc/threads.h).

libgomp keeps a pool of workers per thread that ever ran a graph, and once the
process holds more pooled threads than CPUs it cuts every spin-wait short, so
each graph's barriers sleep: a second Llama's idle engine thread, or the main
thread after one direct ``pair.score``, made decoding about 10x slower on 2
cores. The engine thread frees its pool when it goes idle and a thread that
submits a generation frees its own first. Checked by the process's threads
that Python does not know: the OpenMP workers.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from pydflash import Llama, _core
from pydflash.engine import engine as _engine

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def native_threads() -> int:
    """Threads of this process that are not Python threads (ggml's OpenMP workers)."""
    python = {str(t.native_id) for t in threading.enumerate()}
    return len(set(os.listdir("/proc/self/task")) - python)


def settles_to(n: int, timeout: float = 10.0) -> int:
    """The native thread count once it is at most ``n`` (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (now := native_threads()) > n and time.monotonic() < deadline:
        time.sleep(0.01)
    return now


@pytest.fixture
def lingering_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle engine threads stay alive for the test (a thread's exit would free its pool anyway)."""
    monkeypatch.setattr(_engine, "IDLE_EXIT_S", 60.0)


@pytest.fixture
def base() -> int:
    _core.release_compute_threads()
    n = settles_to(0, timeout=3.0)  # other tests' engines release theirs as they go idle
    return n


def test_an_idle_engine_holds_no_openmp_workers(target_path: Path, lingering_engines: None, base: int):
    with Llama(target_path, n_ctx=256, n_threads=2) as llm:
        llm.pair.score(llm.tokenize("def f(x):"))  # this thread computes: its pool exists
        if native_threads() == base:
            pytest.skip("ggml computes without an OpenMP pool in this build")
        _core.release_compute_threads()
        assert native_threads() <= base
        out = llm.generate("def f(x):", max_tokens=8, ignore_eos=True)
        assert len(out.tokens) == 8
        assert [t.name for t in threading.enumerate()].count("pydflash-engine") >= 1  # alive, idle
        assert settles_to(base) <= base


def test_submitting_a_generation_frees_the_callers_workers(target_path: Path, lingering_engines: None, base: int):
    with Llama(target_path, n_ctx=256, n_threads=2) as llm:
        llm.pair.score(llm.tokenize("import os"))
        if native_threads() == base:
            pytest.skip("ggml computes without an OpenMP pool in this build")
        llm.generate("import os", max_tokens=4, ignore_eos=True)
        assert settles_to(base) <= base  # neither the main thread's pool nor the engine's


def test_two_llamas_used_in_turn_leave_no_workers(
    model_dir: Path, target_path: Path, lingering_engines: None, base: int
):
    with (
        Llama(target_path, n_ctx=256, n_threads=2) as a,
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256, n_threads=2, draft_max=3) as b,
    ):
        for i in range(3):
            for llm in (a, b):
                llm.generate(f"x = {i}", max_tokens=6, ignore_eos=True)
                assert settles_to(base) <= base
