"""The release check's own logic that runs without building anything
(tools/build_wheels.py): the compiler-free PATH it installs the wheel under, and
its phase bookkeeping (a failed phase is recorded, later phases still run)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "build_wheels.py"
_spec = importlib.util.spec_from_file_location("build_wheels", TOOL)
assert _spec is not None and _spec.loader is not None
build_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build_wheels)


def test_the_install_path_has_every_program_but_the_compilers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    names = ["gcc", "g++", "cc", "c++", "cpp", "clang", "clang++", "clang-14", "x86_64-linux-gnu-gcc-12",
             "x86_64-linux-gnu-g++-12", "nvcc", "clang-format", "python3", "git", "tar", "gccgo-wrapper.txt"]
    for n in names:
        f = bin_dir / n
        f.write_text("#!/bin/sh\n")
        f.chmod(0o755 if not n.endswith(".txt") else 0o644)
    monkeypatch.setenv("PATH", str(bin_dir))
    path = build_wheels.compiler_free_path(tmp_path / "nocc")
    found = {n for n in names if shutil.which(n, path=path)}
    assert found == {"clang-format", "python3", "git", "tar"}
    assert all(os.path.islink(os.path.join(path, n)) for n in found)


def test_a_failed_phase_is_recorded_and_the_rest_go_on(tmp_path: Path):
    c = build_wheels.Check(tmp_path, skip={"demo"})

    def boom(e: dict) -> None:
        e["tried"] = True
        raise RuntimeError("it broke")

    assert c.phase("wheel", boom) is None
    assert c.phase("demo", lambda e: 1) is None  # skipped
    assert c.phase("tests", lambda e: 42) == 42
    record = json.loads((tmp_path / "build_wheels.json").read_text())
    assert record["phases"]["wheel"]["ok"] is False and record["phases"]["wheel"]["error"] == "it broke"
    assert record["phases"]["wheel"]["tried"] is True
    assert record["phases"]["demo"] == {"skipped": True}
    assert record["phases"]["tests"]["ok"] is True
    assert c.failed == ["wheel"]


def test_a_failing_command_raises_with_its_output(tmp_path: Path):
    c = build_wheels.Check(tmp_path, skip=set())
    with pytest.raises(RuntimeError, match="exited 3"):
        c.run(["sh", "-c", "echo partial output; exit 3"])
    assert "partial output" in (tmp_path / "build_wheels.log").read_text()
