"""ggml's backends as the build has them: linked in (default build) or loaded from
the package folder at import (dynamic-backend / CUDA build, PYDFLASH_BACKEND_DL=1)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pydflash
from pydflash import _backends, _core

DYNAMIC = _core.dynamic_backends()
dynamic_only = pytest.mark.skipif(not DYNAMIC, reason="default build: backends are linked in")


def test_cpu_backend_reported():
    report = _core.backend_load_report()
    cpu = [b for b in report if b["name"] == "CPU"]
    assert cpu and cpu[0]["loaded"] and cpu[0]["n_devices"] >= 1
    assert "CPU" in _core.loaded_backends()
    assert set(_core.backend_load_errors()) <= {b["name"] for b in report}
    assert {"name", "path", "loaded", "n_devices", "error"} <= set(report[0])


@dynamic_only
def test_cpu_backend_from_package_folder():
    cpu = next(b for b in _core.backend_load_report() if b["name"] == "CPU")
    assert Path(cpu["path"]).parent == Path(_backends.LIB_DIR)
    assert Path(_backends.LIB_DIR) == Path(pydflash.__file__).parent / "lib"


def test_load_backends_is_idempotent():
    before = _core.backend_load_report()
    assert _core.load_backends(_backends.LIB_DIR) == before
    assert _core.backend_load_report() == before


PROBE = """
import json, pydflash
from pydflash import _core
t, d = pydflash.embedded_pair()
with pydflash.Llama(t, draft=d, n_ctx=256, n_gpu_layers=-1) as llm:
    ok = llm.generate("def f(x):", max_tokens=8).tokens
print("PROBE " + json.dumps({"report": _core.backend_load_report(), "errors": _core.backend_load_errors(),
                             "devices": _core.devices(), "n": len(ok)}))
"""


@dynamic_only
def test_broken_backend_module_falls_back_to_cpu(tmp_path: Path):
    """A CUDA module that cannot load (here: not an ELF file; on a machine without a
    driver: libcuda/libcudart missing or no device) is reported with its reason,
    silently, and generation runs on the CPU."""
    # libggml-cpu.so, or one module per ISA level in the release build (libggml-cpu-haswell.so, ...)
    cpu_modules = sorted(Path(_backends.LIB_DIR).glob("libggml-cpu*.so"))
    assert cpu_modules
    for module in cpu_modules:
        shutil.copy2(module, tmp_path / module.name)
    (tmp_path / "libggml-cuda.so").write_bytes(b"not a shared object\n")
    env = dict(os.environ, PYDFLASH_BACKEND_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, text=True, capture_output=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    out = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("PROBE "))[6:])
    cuda = [b for b in out["report"] if b["path"].endswith("libggml-cuda.so")]
    assert cuda and not cuda[0]["loaded"] and cuda[0]["error"]
    assert "cuda" in out["errors"]
    assert [d["name"] for d in out["devices"]] == ["CPU"]
    assert out["n"] == 8


@dynamic_only
def test_missing_backend_folder_reported(tmp_path: Path):
    env = dict(os.environ, PYDFLASH_BACKEND_DIR=str(tmp_path / "nowhere"))
    code = "import json; from pydflash import _core; print(json.dumps(_core.backend_load_errors()))"
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, text=True, capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    errors = json.loads(p.stdout.strip().splitlines()[-1])
    assert any("backend folder not found" in e for e in errors.values())
