"""A bounded run of the grammar and JSON-schema fuzzer (tools/fuzz_grammar.py; a long run
is the same script with --seconds). Every mutated grammar or schema must run or end in
ValueError / GrammarError; crashes, hangs and other exceptions are findings, and the
run fails on any."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "fuzz_grammar.py"


# atheris is in the dev extra (.ci/run installs it), not in test: it does not build everywhere
@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris not installed (pip install .[dev])")
def test_bounded_grammar_fuzz_run_finds_nothing(tmp_path):
    summary = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(TOOL), "--runs", "3000", "--seed", "7",
                           "--findings", str(tmp_path / "findings"), "--json", str(summary)],
                          capture_output=True, text=True, timeout=850)
    assert summary.is_file(), proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = json.loads(summary.read_text())
    assert stats["findings"] == [], stats["findings"][:5]
    assert proc.returncode == 0
    assert stats["runs"] == 3000
    # both kinds, and both outcomes: mutations that still run under the grammar, and refusals
    assert stats["schemas"] > 500 and stats["runs"] - stats["schemas"] > 500, stats
    assert stats["ran"] > 100 and stats["refused"] > 1000, stats
