"""A bounded run of the GGUF load-path fuzzer (tools/fuzz_gguf.py; a long run
is the same script with --seconds). Every mutated file must load cleanly or
end in ModelLoadError / DraftCompatibilityError; crashes, hangs and other
exceptions are findings, and the run fails on any."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "fuzz_gguf.py"


# atheris is in the dev extra (.ci/run installs it), not in test: it does not build everywhere
@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed (pip install .[dev])")
def test_bounded_fuzz_run_finds_nothing(tmp_path):
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--runs", "1500", "--seed", "7",
                           "--findings", str(tmp_path / "findings"), "--json", str(summary)],
                          capture_output=True, text=True, timeout=900)
    assert summary.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = json.loads(summary.read_text())
    assert stats["findings"] == [], stats["findings"][:5]
    assert proc.returncode == 0
    assert stats["runs"] == 1500
    # the mutations reach both outcomes: files that still load and files refused
    assert stats["loaded_as_target"] > 10 and stats["loaded_as_drafter"] > 10, stats
    assert stats["refused_both"] > 100, stats
