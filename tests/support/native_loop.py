"""llama.cpp's own speculative loop, `llama-speculative-simple`, built from the
vendored tree (tools/build_native.py), run on the same files and prompts as
pydflash to compare what each step drafted and accepted.

The tests that need it skip when it is not built, and fail instead when
PYDFLASH_REQUIRE_NATIVE=1 (CI builds it). PYDFLASH_NATIVE_BIN_DIR overrides
where it is looked for (default: build/native/bin of this checkout); the tests
do not rerun a run whose log lost lines, so it must be built by that tool,
which flushes the log at exit."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_STEP = re.compile(r"accepted (\d+)/(\d+) draft tokens")


def native_binary(name: str) -> Path:
    """A program of build/native/bin, or a skip (a failure under PYDFLASH_REQUIRE_NATIVE=1)."""
    bin_dir = Path(os.environ.get("PYDFLASH_NATIVE_BIN_DIR", ROOT / "build" / "native" / "bin"))
    exe = bin_dir / name
    if not os.access(exe, os.X_OK):
        why = f"{exe} is not built (python tools/build_native.py --target {name})"
        if os.environ.get("PYDFLASH_REQUIRE_NATIVE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return exe


def speculative_simple() -> Path:
    """llama-speculative-simple (see native_binary)."""
    return native_binary("llama-speculative-simple")


def native_steps(
    target: Path | str,
    prompt: str,
    n_predict: int,
    spec_types: str,
    *,
    draft: Path | str | None = None,
    draft_max: int = 7,
    n_ctx: int = 2048,
    extra: tuple[str, ...] = (),
) -> list[tuple[int, int]]:
    """(accepted, drafted) of every step of llama.cpp's loop, greedy."""
    exe = speculative_simple()
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "prompt.txt"
        f.write_text(prompt, encoding="utf-8")
        # fmt: off
        cmd = [str(exe), "-m", str(target), "--spec-type", spec_types, "--spec-draft-n-max", str(draft_max),
               "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-f", str(f), "-n", str(n_predict),
               "-c", str(n_ctx), "-b", str(n_ctx), "-ub", "512", "-t", "2", "--temp", "0", "--top-k", "1",
               "--seed", "0", "--ignore-eos", "--no-escape", "-ngl", "0", "-v", *extra]
        # fmt: on
        if draft is not None:
            cmd += ["-md", str(draft), "-ngld", "0"]
        # no reruns: tools/build_native.py links in a flush of its log at exit
        # (upstream it is asynchronous and lost its last lines on a loaded machine)
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-2000:]
        steps = [(int(a), int(n)) for a, n in _STEP.findall(text)]
    assert steps, f"no step lines in llama-speculative-simple's output: {text[-2000:]}"
    assert 1 + sum(a + 1 for a, _ in steps) >= n_predict, f"step lines lost: {text[-2000:]}"
    return steps


def matches_native(ours: list[tuple[int, int]], native: list[tuple[int, int]]) -> None:
    """Step for step the same, up to where pydflash stopped: llama.cpp's loop does
    not cut its last draft at the token budget (n_max 0 means no limit there), so
    it may run one step further."""
    assert len(native) >= len(ours)
    assert ours == native[: len(ours)], next(
        (i, o, n) for i, (o, n) in enumerate(zip(ours, native, strict=False)) if o != n
    )
