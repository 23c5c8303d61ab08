"""The pydflash command line and the step-by-step example, run as users would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pydflash import Llama, embedded_pair
from support.cli import run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("sub", ["generate", "demo", "info"])
def test_help(sub):
    out = run(sub, "--help").stdout
    assert "usage: pydflash " + sub in out


def test_top_level_help_lists_commands():
    out = run("--help").stdout
    for sub in ("generate", "demo", "info"):
        assert sub in out


def test_generate_prints_text_and_stats(target_path, model_dir, baseline):
    proc = run("generate", "-m", str(target_path), "-d", str(model_dir / "drafter-b8.gguf"),
               "-p", "def f():", "-n", "24", "--draft-max", "4", "--ignore-eos", "--n-ctx", "256")
    assert "tau=" in proc.stderr and "acceptance=" in proc.stderr and "tokens=24" in proc.stderr
    want = baseline.generate("def f():", max_tokens=24, ignore_eos=True).text
    assert proc.stdout == want + "\n"


def test_generate_json(target_path, model_dir, baseline):
    proc = run("generate", "-m", str(target_path), "-d", str(model_dir / "drafter-b16.gguf"),
               "-p", "x = 1", "-n", "16", "--ignore-eos", "--json", "--n-ctx", "256")
    data = json.loads(proc.stdout)
    assert data["tokens"] == baseline.generate("x = 1", max_tokens=16, ignore_eos=True).tokens
    assert data["stats"]["n_steps"] >= 1


def test_generate_draft_controls(target_path, model_dir, baseline, dflash_b8):
    # --draft-min 100 drops every block; --draft-p-min 1 cuts blocks where the (very
    # peaked) random drafter is not certain: fewer tokens drafted than without it
    # cuts of the whole block: fixed lengths (--no-draft-adaptive: block size - 1, as draft_max=7)
    want = baseline.generate("x = 1", max_tokens=12, ignore_eos=True).tokens
    full = dflash_b8.generate("x = 1", max_tokens=12, ignore_eos=True, draft_max=7).stats.n_drafted
    common = ("generate", "-m", str(target_path), "-d", str(model_dir / "drafter-b8.gguf"), "-p", "x = 1",
              "-n", "12", "--ignore-eos", "--json", "--n-ctx", "256", "--no-draft-adaptive")
    drafted = {}
    for flag, value in (("--draft-min", "100"), ("--draft-p-min", "1")):
        data = json.loads(run(*common, flag, value).stdout)
        assert data["tokens"] == want, flag
        drafted[flag] = data["stats"]["n_drafted"]
    assert drafted["--draft-min"] == 0 and drafted["--draft-p-min"] < full
    bad = run(*common, "--draft-p-min", "1.5", check=False)
    assert bad.returncode == 2 and "draft_p_min" in bad.stderr and "Traceback" not in bad.stderr


def test_generate_bad_file_is_a_clean_error(tmp_path):
    proc = run("generate", "-m", str(tmp_path / "missing.gguf"), "-p", "x", check=False)
    assert proc.returncode == 2
    assert "file not found" in proc.stderr and "Traceback" not in proc.stderr


def test_info_compatible(target_path, model_dir):
    proc = run("info", "-m", str(target_path), "-d", str(model_dir / "drafter-b8.gguf"))
    assert "drafter fits target: yes" in proc.stdout
    assert "CPU" in proc.stdout
    assert "dflash.block_size = 8" in proc.stdout


def test_info_incompatible_json(target_path, tmp_path):
    from pydflash import gguf_writers
    from support.models import TARGET

    bad = gguf_writers.write_drafter(tmp_path / "bad.gguf", TARGET, gguf_writers.DrafterSpec(target_layers=(7,)))
    proc = run("info", "-m", str(target_path), "-d", str(bad), "--json", check=False)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["compatible"] is False and "out of range" in data["incompatibility"]
    assert data["target"]["architecture"] == "qwen3" and data["drafter"]["architecture"] == "dflash"


def test_demo_runs():
    # as much decoding as one run of 48 tokens: two interleaved runs of 24
    proc = run("demo", "--max-tokens", "24", "--repeats", "2", "--prompt", "def f():\n", "--pad-ffn", "2048")
    assert "embedded pair: trained" in proc.stdout
    assert "identical to the target alone: True" in proc.stdout
    assert "speed-up" in proc.stdout and "tau" in proc.stdout and "overall" in proc.stdout
    assert "over 2 interleaved repeats" in proc.stdout


def test_demo_interleaves_repeats_and_says_when_the_machine_is_busy(monkeypatch, capsys):
    import os

    from pydflash.cli import demo, main

    monkeypatch.setattr(os, "getloadavg", lambda: (float(os.cpu_count() or 1) + 0.5, 0.0, 0.0))
    rc = main(["demo", "--max-tokens", "16", "--prompt", "def f():\n", "--pad-ffn", "0", "--repeats", "2", "-t", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    first, *rest = out.splitlines()
    assert first.startswith("warning: the load average") and "cores" in first
    assert not any(line.startswith("warning") for line in rest)  # one line
    overall = next(line for line in rest if line.startswith("overall:"))
    assert "over 2 interleaved repeats" in overall
    assert demo.busy_warning(load=1.0, cores=2) is None and demo.busy_warning(load=2.5, cores=2)
    assert demo.spread([2.0, 1.0, 3.0]) == "2.00x (min 1.00x, max 3.00x over 3 interleaved repeats)"


def test_step_by_step_example():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "step_by_step.py"), "--steps", "6"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("step ") >= 6 and "target passes" in proc.stdout
    # the shipped pair, not random weights: its text is the target alone's greedy text
    assert "\ufffd" not in proc.stdout and "def fibonacci(n):" in proc.stdout
    head, text = proc.stdout.split(" target passes:\n")
    n_tokens = int(head.rsplit("\n", 1)[-1].split()[0])
    target, _ = embedded_pair()
    with Llama(target, n_ctx=1024) as base:
        prompt = base.tokenize(b"def fibonacci(n):\n")
        expected = base.generate(prompt, max_tokens=n_tokens, ignore_eos=True).text
    assert text == "def fibonacci(n):\n" + expected + "\n"


def test_generate_structured_output(tmp_path):
    import re

    import pydflash

    target, drafter = pydflash.embedded_pair()
    base = ["generate", "-m", str(target), "-d", str(drafter), "--json"]
    out = run(*base, "-p", "x = ", "-n", "16", "--grammar", 'root ::= [0-9]{1,3} ";"')
    assert re.fullmatch(r"[0-9]{1,3};", json.loads(out.stdout)["text"])
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                  "additionalProperties": False}))
    out = run(*base, "-p", "record = ", "-n", "64", "--json-schema-file", str(schema))
    obj = json.loads(json.loads(out.stdout)["text"])
    assert list(obj) == ["a"] and isinstance(obj["a"], int)
    bad = run(*base, "-p", "x", "--grammar", "root ::= [", check=False)
    assert bad.returncode == 2 and "does not parse" in bad.stderr
    missing = run(*base, "-p", "x", "--grammar-file", str(tmp_path / "nope.gbnf"), check=False)
    assert missing.returncode == 2 and "nope.gbnf" in missing.stderr
    both = run(*base, "-p", "x", "--grammar", "root ::= [a]", "-j", "{}", check=False)
    assert both.returncode == 2 and "not allowed with" in both.stderr

