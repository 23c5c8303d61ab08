"""tools/fetch_llama_cpp.py: the pinned archive is verified and only its
llama.cpp folder is extracted (offline: a hand-made archive stands in)."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fetch():
    spec = importlib.util.spec_from_file_location("fetch_llama_cpp", ROOT / "tools" / "fetch_llama_cpp.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def make_sdist(path: Path, prefix: str) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {
            f"{prefix}CMakeLists.txt": b"project(x)\n",
            f"{prefix}src/llama.cpp": b"// code\n",
            f"{prefix}models/big.gguf": b"weights",
            f"{prefix}.git": b"gitdir: ../../.git/modules/llama.cpp",
            "llama_cpp_python-0.3.36/llama_cpp/llama.py": b"# not wanted",
        }.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_hash_mismatch_is_refused(fetch, tmp_path):
    sdist = tmp_path / fetch.SDIST
    make_sdist(sdist, fetch.PREFIX)
    with pytest.raises(SystemExit, match="sha256 mismatch"):
        fetch.main(["--sdist", str(sdist), "--dest", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_extracts_only_the_llama_cpp_folder(fetch, tmp_path, monkeypatch):
    sdist = tmp_path / fetch.SDIST
    make_sdist(sdist, fetch.PREFIX)
    monkeypatch.setattr(fetch, "SHA256", fetch.sha256_of(sdist))
    dest = tmp_path / "vendor" / "llama.cpp"
    assert fetch.main(["--sdist", str(sdist), "--dest", str(dest)]) == 0
    assert (dest / "CMakeLists.txt").read_bytes() == b"project(x)\n"
    assert (dest / "src" / "llama.cpp").exists()
    assert not (dest / "models").exists() and not (dest / ".git").exists()
    record = json.loads((dest / "VENDORED.json").read_text())
    assert record["upstream_commit"] == "0c1e57098" and record["version"] == "0.3.36"
    # present already: nothing to do
    assert fetch.main(["--dest", str(dest)]) == 0


def test_pinned_values_match_design(fetch):
    assert fetch.SHA256 == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    assert fetch.PACKAGE == "llama-cpp-python" and fetch.VERSION == "0.3.36"
