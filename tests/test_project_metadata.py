"""pyproject.toml as a user and a packager read it: the extras install what they say
on every platform, and the CUDA switch means the same wherever it is read."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _provider():
    spec = importlib.util.spec_from_file_location("pydflash_extras", ROOT / "build_support" / "pydflash_extras.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "on", "yes"])
def test_cuda_switch_values_all_mean_the_cuda_build(value):
    assert _provider().cuda_build({"PYDFLASH_CUDA": value})


@pytest.mark.parametrize("env", [{}, {"PYDFLASH_CUDA": "0"}, {"PYDFLASH_CUDA": "false"}])
def test_without_the_switch_the_cuda_extra_installs_no_runtime(env, monkeypatch):
    p = _provider()
    assert not p.cuda_build(env)
    for k in ("PYDFLASH_CUDA", "CMAKE_ARGS"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert p.dynamic_metadata("optional-dependencies") == {"cuda": []}
    monkeypatch.setenv("PYDFLASH_CUDA", "true")
    assert p.dynamic_metadata("optional-dependencies")["cuda"] == p.CUDA_RUNTIME


def test_a_switch_value_that_is_neither_is_refused():
    with pytest.raises(ValueError, match="PYDFLASH_CUDA must be"):
        _provider().cuda_build({"PYDFLASH_CUDA": "maybe"})
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert 'MATCHES "^(1|on|true|yes|y)$"' in cmake  # the build reads the same values


def test_test_extra_installs_everywhere_and_dev_has_the_tools():
    extras = PROJECT["optional-dependencies"]
    test = " ".join(extras["test"])
    assert "atheris" not in test and "clang-format" not in test
    assert {"atheris", "clang-format>=18", "ruff>=0.6", "mypy>=1.11"} <= set(extras["dev"])
    assert 'pip install ".[test,dev,docs,train]"' in (ROOT / ".ci" / "run").read_text()  # CI installs the tools too


def test_every_test_has_a_timeout():
    # a test that hangs (a deadlock, a grammar that never ends) fails; it does not hang the run
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(config["timeout"]) <= 900
    assert any(r.startswith("pytest-timeout") for r in PROJECT["optional-dependencies"]["test"])


def test_metadata_a_package_index_shows():
    assert PROJECT["license"] == "MIT"  # an SPDX expression
    assert any(c.startswith("Programming Language :: Python :: 3") for c in PROJECT["classifiers"])
    for name, target in PROJECT["urls"].items():
        assert (ROOT / target).is_file(), (name, target)


def test_star_import_does_not_shadow_the_standard_library():
    import inspect as stdlib_inspect

    namespace: dict[str, object] = {"inspect": stdlib_inspect}
    exec("from pydflash import *", namespace)
    assert namespace["inspect"] is stdlib_inspect
    import pydflash

    assert "inspect_gguf" in pydflash.__all__
    with pytest.warns(DeprecationWarning, match="inspect_gguf"):
        info = pydflash.inspect(pydflash.embedded_pair()[0])
    assert info == pydflash.inspect_gguf(pydflash.embedded_pair()[0])
