"""A new user's first hour with the command line: every command runs without
arguments on the shipped pair, llama.cpp's flags work, and what would waste a
run (a missing plotting library, figures that are noise) is said first."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

import pydflash
from pydflash import cli
from pydflash.cli import bench as bench_command


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pydflash", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_runs_the_shipped_pair_without_arguments():
    proc = run("generate", "-n", "16")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "tau=" in proc.stderr and "drafted=" in proc.stderr


def test_llama_cpp_short_flags_and_sampler_flags(llama_configs, capsys):
    t, d = pydflash.embedded_pair()
    rc = cli.main(["generate", "-m", t, "-md", d, "-p", "x", "-n", "2", "-c", "256", "-t", "1", "-tb", "1",
                   "-b", "128", "-ub", "64", "-s", "5", "--temp", "0.7", "--min-p", "0.1", "--top-k", "20",
                   "--repeat-last-n", "32", "--json"])
    assert rc == 0, capsys.readouterr().err
    (c,) = llama_configs
    assert (c.n_ctx, c.n_threads, c.n_threads_batch, c.n_batch, c.n_ubatch, c.seed) == (256, 1, 1, 128, 64, 5)
    assert c.draft_max is None
    help_text = run("generate", "--help").stdout
    for flag in ("--min-p", "--typical", "--top-nsigma", "--repeat-penalty", "--repeat-last-n", "--presence-penalty",
                 "--frequency-penalty", "--temp", "-s SEED", "-c N_CTX"):
        assert flag in help_text, flag


def test_charts_without_matplotlib_fail_before_the_bench(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    started = []
    monkeypatch.setattr("pydflash.bench.run", lambda cfg: started.append(cfg))
    rc = cli.main(["bench", "--quick", "--charts", "charts-dir"])
    assert rc == 2 and started == []
    assert "--charts needs matplotlib" in capsys.readouterr().err


def test_bench_says_when_its_figures_are_noise():
    rows = [{"engine": "pydflash-dflash", "isl": 64, "draft_max": 4, "tau": 1.02, "speedup": 1.8},
            {"engine": "pydflash-dflash", "isl": 256, "draft_max": 4, "tau": 3.1, "speedup": 2.2}]
    warns = bench_command.noise_warnings(1, 0, rows)
    assert any("one repeat" in w for w in warns) and any("no warm-up" in w for w in warns)
    assert [w for w in warns if "tau 1.02" in w] and not [w for w in warns if "ISL 256" in w]
    assert bench_command.noise_warnings(3, 1, rows[1:]) == []


def _first_line(args: list[str], stream: str, want: str, timeout: float = 240) -> str:
    """Start ``pydflash ARGS``, wait for a line of ``stream`` holding ``want``, stop it."""
    lines: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "pydflash", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:

        def read() -> None:
            for line in getattr(proc, stream):
                lines.append(line)
                if want in line:
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        proc.kill()
        proc.communicate()
        reader.join()
    return "".join(lines)


def test_bench_starts_without_arguments():
    out = _first_line(["bench"], "stdout", "target: embedded pair")
    assert "target: embedded pair" in out, out


def test_serve_starts_without_arguments():
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 8080))  # serve's default port
        except OSError:
            pytest.skip("port 8080 is in use here")
    pytest.importorskip("uvicorn")
    err = _first_line(["serve"], "stderr", "serving")
    assert "serving" in err and "8080" in err, err
