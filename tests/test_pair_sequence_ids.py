"""A sequence id the pair does not have raises ValueError before any cache is
touched: to llama.cpp, -1 means every sequence, and an id outside its range
fails an assertion that aborts the interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROMPT = "def main(argv=None):\n    return argv"


def test_reset_of_sequence_minus_one_leaves_the_caches(dflash_b8, tmp_path):
    core = dflash_b8._engine._core
    dflash_b8.pair.prefill(dflash_b8.tokenize(PROMPT))
    core.save_sequence(0, str(tmp_path / "before"))
    with pytest.raises(ValueError, match="out of range"):
        core.reset(-1)
    core.save_sequence(0, str(tmp_path / "after"))  # both caches' state of the sequence, and its tokens
    assert (tmp_path / "after").read_bytes() == (tmp_path / "before").read_bytes()


PROBE = """
import sys
from pydflash import Llama
with Llama(sys.argv[1], draft=sys.argv[2], n_ctx=256) as llm:
    for seq in (-2, 300):
        try:
            llm._engine._core.reset(seq)
        except ValueError:
            print("ValueError", seq)
"""


def test_reset_of_an_id_llama_cpp_asserts_on_raises(model_dir, target_path):
    out = subprocess.run([sys.executable, "-c", PROBE, str(target_path), str(model_dir / "drafter-b8.gguf")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["ValueError -2", "ValueError 300"]
