"""The tools that run llama.cpp's server tests against both servers: the shim's
flag mapping (tools/llama_server_shim.py) and the comparison of the two runs
(tools/server_suite_compare.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


shim = _load("llama_server_shim")
compare = _load("server_suite_compare")

ARGV = ["--port", "8080", "--hf-repo", "ggml-org/models", "--hf-file", "x.gguf", "-b", "512", "-np", "2",
        "--offline", "--model-draft", "/tmp/d.gguf", "-c", "256"]  # fmt: skip


def test_the_shim_maps_hub_models_to_the_local_pair(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYDFLASH_SHIM_MODEL", "/m/target.gguf")
    monkeypatch.setenv("PYDFLASH_SHIM_DRAFT", "/m/draft.gguf")
    out = shim.translate(ARGV)
    assert out[:4] == ["-m", "/m/target.gguf", "-md", "/m/draft.gguf"]
    # the rest reaches pydflash serve unchanged, less what it does not tune
    assert out[4:] == ["--port", "8080", "-np", "2", "-c", "256"]


def test_the_shim_gives_llama_server_every_flag_but_the_model_source(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYDFLASH_SHIM_MODEL", "/m/target.gguf")
    out = shim.translate_native(ARGV)
    assert out == ["-m", "/m/target.gguf", "--port", "8080", "-b", "512", "-np", "2", "--offline",
                   "--model-draft", "/tmp/d.gguf", "-c", "256"]  # fmt: skip


def test_server_tools_make_localhost_the_default_cors_origin_as_in_llama_server(monkeypatch: pytest.MonkeyPatch):
    # llama-server: --tools (or MCP servers) without --cors-origins serves loopback origins only
    monkeypatch.setenv("PYDFLASH_SHIM_MODEL", "/m/target.gguf")
    out = shim.translate(["--port", "8080", "--tools", "all"])
    assert "--tools" not in out and out[out.index("--cors-origins") + 1] == "localhost"
    out = shim.translate(["--tools", "all", "--cors-origins", "https://app.example"])
    assert out.count("--cors-origins") == 1 and out[out.index("--cors-origins") + 1] == "https://app.example"
    assert "--cors-origins" not in shim.translate(["--port", "8080"])


def _junit(path: Path, cases: dict[str, str]) -> str:
    body = []
    for name, state in cases.items():
        cls, test = name.split("::")
        inner = {"pass": "", "fail": '<failure message="assert 1 == 2">x</failure>', "skip": "<skipped/>"}[state]
        body.append(f'<testcase classname="unit.{cls}" name="{test}">{inner}</testcase>')
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(body)}</testsuite></testsuites>')
    return str(path)


def test_the_share_counts_only_what_llama_server_passes_in_scope(tmp_path: Path):
    ref = _junit(tmp_path / "ls.xml", {"test_basic::a": "pass", "test_basic::b": "pass", "test_basic::c": "fail",
                                       "test_completion::d": "pass", "test_embedding::e": "pass"})  # fmt: skip
    cand = _junit(tmp_path / "pd.xml", {"test_basic::a": "pass", "test_basic::b": "fail", "test_basic::c": "pass",
                                        "test_completion::d": "skip", "test_embedding::e": "fail"})  # fmt: skip
    res = compare.compare(compare.outcomes(ref), compare.outcomes(cand))
    assert res["reference_passed"] == 4 and res["reference_passed_in_scope"] == 3  # embeddings are out of scope
    assert res["candidate_passed_of_in_scope"] == 1  # c passes only on pydflash: not counted
    assert res["share"] == pytest.approx(1 / 3, abs=1e-4)
    assert res["failing"] == {"test_basic::b": "assert 1 == 2", "test_completion::d": ""}
    assert res["failing_by_file"] == {"test_basic": 1, "test_completion": 1}
