"""The release helpers (tools/wheel_tools.py): a CUDA wheel's local version label and
its PEP 503 index, checked with the real pip resolving from file:// indexes (no
network): a CPU wheel and a CUDA wheel of the same release never share a name and
version, and the CUDA index wins when it is given."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "wheel_tools.py"
_spec = importlib.util.spec_from_file_location("wheel_tools", TOOL)
assert _spec is not None and _spec.loader is not None
wheel_tools = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheel_tools)

TAGS = "py3-none-any"


def fake_wheel(folder: Path, version: str = "0.1.0") -> Path:
    """A minimal, installable pydflash wheel (one module) as a build backend writes it."""
    info = f"pydflash-{version}.dist-info/"
    files = {
        "pydflash_fake_marker.py": b"WHAT = 'fake'\n",
        info + "METADATA": f"Metadata-Version: 2.1\nName: pydflash\nVersion: {version}\n\nbody\n".encode(),
        info + "WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {TAGS}\n".encode(),
    }
    record = [wheel_tools._record_line(p, d) for p, d in files.items()] + [info + "RECORD,,"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"pydflash-{version}-{TAGS}.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(info + "RECORD", "\n".join(record) + "\n")
    return path


def check_record(wheel: Path) -> dict[str, str]:
    """Every file's RECORD hash and size match its bytes; returns the dist-info files."""
    with zipfile.ZipFile(wheel) as z:
        record = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [line.split(",") for line in z.read(record).decode().splitlines()]
        assert {r[0] for r in rows} == set(z.namelist())
        for path, digest, size in rows:
            if path == record:
                assert digest == size == ""
                continue
            data = z.read(path)
            expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expect}" and int(size) == len(data), path
        return {n: z.read(n).decode() for n in z.namelist() if ".dist-info/" in n}


def test_relabel_renames_version_and_rewrites_record(tmp_path: Path):
    src = fake_wheel(tmp_path / "cpu")
    out = wheel_tools.relabel(src, "cu13", tmp_path / "cu13")
    assert out.name == f"pydflash-0.1.0+cu13-{TAGS}.whl"
    info = check_record(out)
    assert set(info) == {f"pydflash-0.1.0+cu13.dist-info/{n}" for n in ("METADATA", "WHEEL", "RECORD")}
    assert "Version: 0.1.0+cu13\n" in info["pydflash-0.1.0+cu13.dist-info/METADATA"]
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(out) as b:
        assert a.read("pydflash_fake_marker.py") == b.read("pydflash_fake_marker.py")


@pytest.mark.parametrize("label", ["", "CU13", "cu-13", "cu13+x"])
def test_relabel_refuses_bad_labels(tmp_path: Path, label: str):
    with pytest.raises(ValueError, match="local version label"):
        wheel_tools.relabel(fake_wheel(tmp_path), label, tmp_path / "out")


def test_relabel_refuses_a_labelled_wheel_and_a_non_wheel(tmp_path: Path):
    once = wheel_tools.relabel(fake_wheel(tmp_path / "a"), "cu13", tmp_path / "b")
    with pytest.raises(ValueError, match="already has a local version label"):
        wheel_tools.relabel(once, "cu14", tmp_path / "c")
    with pytest.raises(ValueError, match="not a wheel file name"):
        wheel_tools.parse_wheel_name("pydflash-0.1.0.tar.gz")


def pip_choice(*index_args: str) -> str:
    """The pydflash version pip would install from these indexes (dry run, no config)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "--isolated",
        "install",
        "--dry-run",
        "--no-deps",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        *index_args,
        "pydflash",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    (item,) = report["install"]
    return str(item["metadata"]["version"])


def test_pip_takes_the_cuda_index_only_when_given(tmp_path: Path):
    cpu = fake_wheel(tmp_path / "dist")
    cu13 = wheel_tools.relabel(cpu, "cu13", tmp_path / "dist-cu13")
    public = wheel_tools.write_index([cpu], tmp_path / "public" / "simple")
    cuda = wheel_tools.write_index([cu13], tmp_path / "site" / "whl" / "cu13")
    page = (cuda / "pydflash" / "index.html").read_text()
    assert "pydflash-0.1.0%2Bcu13-py3-none-any.whl#sha256=" in page
    assert (cuda / "index.html").read_text().count('href="pydflash/"') == 1

    assert pip_choice("--index-url", public.as_uri()) == "0.1.0"
    assert pip_choice("--index-url", public.as_uri(), "--extra-index-url", cuda.as_uri()) == "0.1.0+cu13"
    # and the relabelled wheel installs, with its own version in the metadata
    target = tmp_path / "site-packages"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--isolated",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(target),
            "--index-url",
            cuda.as_uri(),
            "pydflash==0.1.0+cu13",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert (target / "pydflash-0.1.0+cu13.dist-info" / "METADATA").is_file()
    assert (target / "pydflash_fake_marker.py").read_text() == "WHAT = 'fake'\n"


def test_cli_index_of_an_empty_folder_fails(tmp_path: Path):
    assert wheel_tools.main(["index", str(tmp_path), "-o", str(tmp_path / "out")]) == 2
