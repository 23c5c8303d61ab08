"""What an installed pydflash carries, wherever it came from (`pip install .`, the
release wheel under tools/build_wheels.py or cibuildwheel): the tests run against the
installed package, never the source tree, and it ships its stubs, licences and, in
the dynamic-backend builds, its libraries with RPATHs that stay inside the package."""

from __future__ import annotations

import importlib.metadata
import re
import struct
import sys
from pathlib import Path

import pytest

import pydflash
from pydflash import _core

ROOT = Path(__file__).resolve().parent.parent
PKG = Path(pydflash.__file__).resolve().parent


def test_imported_from_the_installed_package_not_the_source_tree():
    assert not PKG.is_relative_to(ROOT / "src"), f"pydflash was imported from the source tree: {PKG}"
    assert any(PKG.is_relative_to(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir())
    # the distribution's own metadata names this version (a local label such as +cu13 may follow)
    assert re.fullmatch(re.escape(pydflash.__version__) + r"(\+[a-z0-9.]+)?", importlib.metadata.version("pydflash"))


def test_stubs_and_licences_are_installed():
    assert (PKG / "py.typed").is_file()
    assert (PKG / "_core.pyi").is_file()
    licences = {p.name for p in (PKG / "licenses").iterdir()}
    assert "LICENSE-llama.cpp" in licences


def test_the_chat_page_is_installed_and_small():
    pytest.importorskip("starlette")  # the server extra
    from pydflash.server.webui import WebUI

    files = WebUI().files  # what GET / and the page's other paths answer, read from the package
    assert "/" in files and all(body for body, _, _ in files.values())
    on_disk = sum(p.stat().st_size for p in (PKG / "server" / "webui").iterdir())
    assert on_disk == sum(len(body) for body, _, _ in files.values())  # no file shipped that is not served
    assert on_disk < 150 * 1024  # the page's share of the wheel


def _elf_dynamic(path: Path) -> tuple[list[str], list[str]]:
    """(DT_NEEDED, DT_RPATH/DT_RUNPATH entries) of a 64-bit ELF file, read from its
    dynamic section (not ``ldd``, which would resolve through this machine's paths)."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    end = "<" if data[5] == 1 else ">"
    (shoff,) = struct.unpack_from(end + "Q", data, 0x28)
    shentsize, shnum = struct.unpack_from(end + "HH", data, 0x3A)
    sections = [struct.unpack_from(end + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next(s for s in sections if s[1] == 6)  # SHT_DYNAMIC
    strtab = sections[dynamic[6]]  # sh_link: the dynamic string table
    needed, paths = [], []
    for off in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, val = struct.unpack_from(end + "qQ", data, off)
        if tag == 0:
            break
        if tag in (1, 15, 29):  # DT_NEEDED, DT_RPATH, DT_RUNPATH
            s = data[strtab[4] + val : data.index(b"\0", strtab[4] + val)].decode()
            (needed if tag == 1 else paths).append(s)
    return needed, paths


@pytest.mark.skipif(not _core.dynamic_backends(), reason="default build: one static extension, no libraries")
@pytest.mark.skipif(sys.platform != "linux", reason="ELF")
def test_dynamic_build_libraries_resolve_inside_the_package():
    """Every library the package ships finds its siblings through $ORIGIN, not this
    machine's build tree; the CPU backend is present as one or several modules."""
    lib = PKG / "lib"
    shipped = {p.name for p in lib.iterdir()}
    assert any(re.fullmatch(r"libggml-cpu(-[\w.]+)?\.so", n) for n in shipped), shipped
    for f in [*PKG.glob("_core*.so"), *lib.glob("*.so")]:
        needed, paths = _elf_dynamic(f)
        for p in ":".join(paths).split(":"):
            assert not p or p.startswith("$ORIGIN"), f"{f.name} has RPATH {p}"
        for n in needed:
            if n.startswith(("libllama", "libggml")):
                assert n in shipped, f"{f.name} needs {n}, which the package does not ship"
