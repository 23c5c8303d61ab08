"""The committed corpus of crafted bad GGUF files (tools/make_bad_gguf.py):
each one ends in ModelLoadError or DraftCompatibilityError. The files are
loaded in a child process, so a crash would be caught and reported (as the
case that was loading), not take the test run down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


DATA = Path(__file__).parent / "data"
CASES = sorted((DATA / "bad_gguf").glob("*.gguf"))

WORKER = r"""
import sys
from pydflash import Llama, ModelLoadError, DraftCompatibilityError
good = sys.argv[1]
for path in sys.argv[2:]:
    for role in ("target", "drafter"):
        print("START", role, path, flush=True)
        try:
            if role == "target":
                Llama(path, n_ctx=64).close()
            else:
                Llama(good, draft=path, n_ctx=64).close()
            print("LOADED", role, path, flush=True)
        except (ModelLoadError, DraftCompatibilityError) as e:
            assert path in str(e), str(e)
            print("REFUSED", role, path, type(e).__name__, flush=True)
"""


def run_all(paths: list[Path]) -> tuple[dict, list[str]]:
    """Outcome per (role, path); restarts the worker after a crash."""
    results: dict[tuple[str, str], str] = {}
    crashes: list[str] = []
    todo = [str(p) for p in paths]
    while todo:
        proc = subprocess.run([sys.executable, "-c", WORKER, str(DATA / "good-tiny.gguf"), *todo],
                              capture_output=True, text=True, timeout=600)
        started = None
        for line in proc.stdout.splitlines():
            parts = line.split(" ")
            if parts[0] == "START":
                started = (parts[1], parts[2])
            elif parts[0] in ("LOADED", "REFUSED"):
                results[(parts[1], parts[2])] = parts[0] if parts[0] == "LOADED" else parts[3]
                started = None
        if proc.returncode == 0:
            break
        if started is None:
            raise AssertionError(f"worker failed outside a case:\n{proc.stderr[-3000:]}")
        crashes.append(f"{started} (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        results[started] = "CRASH"
        # resume after the crashing file
        todo = todo[todo.index(started[1]) + (1 if started[0] == "drafter" else 0):]
        if started[0] == "target":
            results[("drafter", started[1])] = "SKIPPED"
            todo = todo[1:]
    return results, crashes


def test_corpus_is_present():
    assert len(CASES) >= 100
    assert (DATA / "good-tiny.gguf").is_file()


def test_every_bad_file_is_refused_cleanly():
    results, crashes = run_all(CASES)
    assert not crashes, "\n".join(crashes)
    loaded = sorted(f"{r} {Path(p).name}" for (r, p), v in results.items() if v == "LOADED")
    assert not loaded, f"loaded although malformed: {loaded}"
    assert len(results) == 2 * len(CASES)
    assert set(results.values()) <= {"ModelLoadError", "DraftCompatibilityError"}


def test_the_good_file_loads_in_the_same_harness():
    results, crashes = run_all([DATA / "good-tiny.gguf"])
    assert not crashes
    assert results[("target", str(DATA / "good-tiny.gguf"))] == "LOADED"
