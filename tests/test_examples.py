"""Every script in examples/ runs as a user would run it (small token counts)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_examples_are_all_tested():
    tested = {"step_by_step.py", "chat.py", "streaming.py", "server_openai.py", "many_streams.py"}
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == tested


def test_every_example_has_a_test_here():
    # each examples/NAME.py is run by test_NAME_example below (server_openai.py: test_server_example)
    names = {p.stem.removesuffix("_openai") for p in (ROOT / "examples").glob("*.py")}
    assert {n for n in names if f"test_{n}_example" not in globals()} == set()


def test_step_by_step_example():
    out = run("step_by_step.py", "--steps", "6", "--draft-max", "7")
    assert out.count("step ") >= 6 and "target passes" in out
    assert "drafted 7" in out  # a pinned draft_max: each step drafts the whole length asked


def test_chat_example():
    out = run("chat.py", "--max-tokens", "24")
    assert "<|im_start|>user" in out  # the embedded pair has no template: ChatML
    assert "assistant:" in out and "DFlash: drafted" in out and "target passes" in out


def test_streaming_example():
    out = run("streaming.py", "--max-tokens", "24")
    assert "finish_reason=length" in out and "accepted draft tokens per step: [" in out and "tau = " in out


def test_many_streams_example():
    out = run("many_streams.py", "--max-tokens", "16", "--parallel", "2")
    assert out.count("--- ") == 4 and "generate_batch, same texts: True" in out
    assert "up to 2 sequences shared a speculative step" in out


def test_server_example():
    pytest.importorskip("openai")
    out = run("server_openai.py", "--max-tokens", "16")
    assert "chat:" in out and "stream:" in out
    assert "metrics: pydflash_draft_tokens_total" in out and "metrics: pydflash_draft_acceptance_rate" in out
