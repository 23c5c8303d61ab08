"""Release helpers for wheels: a local version label and a PEP 503 index.

The CUDA wheels carry a local version label (``0.1.0+cu13``) and live on their own
index (``whl/cu13/``), as PyTorch's do: the CPU wheel on the public index and the CUDA
wheel never share a name and version, and ``pip install pydflash --extra-index-url
<host>/whl/cu13`` takes the CUDA one because PEP 440 orders ``0.1.0+cu13`` after
``0.1.0``.

    python tools/wheel_tools.py relabel dist/pydflash-0.1.0-cp311-...whl --label cu13 -o wheelhouse/cu13
    python tools/wheel_tools.py index wheelhouse/cu13 -o site/whl/cu13

Used by ``tools/build_wheels.py`` and the wheel workflow; tested by
``tests/test_wheel_tools.py`` with the real pip.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import re
import shutil
import sys
import zipfile
from pathlib import Path

# A wheel file name: {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?P<rest>(-\d[^-]*)?-[^-]+-[^-]+-[^-]+)\.whl$")
_LABEL_RE = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")


def parse_wheel_name(filename: str) -> tuple[str, str, str]:
    """(distribution, version, the rest of the name: build and tags) of a wheel file name."""
    m = _WHEEL_RE.match(filename)
    if m is None:
        raise ValueError(f"not a wheel file name: {filename!r}")
    return m["name"], m["version"], m["rest"]


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def relabel(wheel: Path, label: str, out_dir: Path) -> Path:
    """A copy of ``wheel`` whose version has the local label ``+label``.

    Renames the ``.dist-info`` folder, rewrites ``Version:`` in METADATA and RECORD's
    hashes; every other file is copied byte for byte."""
    if not _LABEL_RE.match(label):
        raise ValueError(f"a local version label is lower-case letters and digits separated by dots, got {label!r}")
    name, version, rest = parse_wheel_name(wheel.name)
    if "+" in version:
        raise ValueError(f"{wheel.name} already has a local version label")
    new_version = f"{version}+{label}"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}-{new_version}{rest}.whl"
    record: list[str] = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        if old_info + "METADATA" not in names:
            raise ValueError(f"{wheel.name} has no {old_info}METADATA")
        for info in src.infolist():
            path = info.filename
            if path == old_info + "RECORD":
                continue
            data = src.read(info)
            if path.startswith(old_info):
                path = new_info + path[len(old_info) :]
            if path == new_info + "METADATA":
                data = _set_version(data, version, new_version)
            copy = zipfile.ZipInfo(path, date_time=info.date_time)
            copy.external_attr = info.external_attr
            copy.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(copy, data)
            record.append(_record_line(path, data))
        record.append(new_info + "RECORD,,")
        dst.writestr(new_info + "RECORD", "\n".join(record) + "\n")
    return target


def _set_version(metadata: bytes, old: str, new: str) -> bytes:
    text = metadata.decode("utf-8")
    line = f"Version: {old}\n"
    if line not in text:
        raise ValueError(f"METADATA has no line {line.strip()!r}")
    return text.replace(line, f"Version: {new}\n", 1).encode("utf-8")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _normalize(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def write_index(wheels: list[Path], out_dir: Path) -> Path:
    """A PEP 503 "simple" index of ``wheels`` in ``out_dir`` (copied into it), as a static
    web host or ``file://`` serves it: ``out_dir/index.html`` and
    ``out_dir/<project>/index.html`` with ``#sha256=`` links."""
    projects: dict[str, list[Path]] = {}
    for w in wheels:
        projects.setdefault(_normalize(parse_wheel_name(w.name)[0]), []).append(w)
    out_dir.mkdir(parents=True, exist_ok=True)
    for project, files in sorted(projects.items()):
        pdir = out_dir / project
        pdir.mkdir(exist_ok=True)
        links = []
        for w in sorted(files):
            dest = pdir / w.name
            if dest.resolve() != w.resolve():
                shutil.copy2(w, dest)
            href = html.escape(w.name.replace("+", "%2B"))
            links.append(f'    <a href="{href}#sha256={_sha256(dest)}">{html.escape(w.name)}</a><br/>')
        (pdir / "index.html").write_text(_page(f"Links for {project}", links))
    root = [f'    <a href="{p}/">{p}</a><br/>' for p in sorted(projects)]
    (out_dir / "index.html").write_text(_page("Simple index", root))
    return out_dir


def _page(title: str, lines: list[str]) -> str:
    body = "\n".join(lines)
    return f"<!DOCTYPE html>\n<html>\n  <head><title>{title}</title></head>\n  <body>\n{body}\n  </body>\n</html>\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("relabel", help="copy a wheel with a local version label (+cu13)")
    r.add_argument("wheel", type=Path)
    r.add_argument("--label", required=True, help="the local label, e.g. cu13")
    r.add_argument("-o", "--out", type=Path, required=True, help="folder for the relabelled wheel")
    i = sub.add_parser("index", help="write a PEP 503 index of the wheels in a folder")
    i.add_argument("wheels", type=Path, help="folder of .whl files")
    i.add_argument("-o", "--out", type=Path, required=True, help="the index folder (e.g. site/whl/cu13)")
    args = ap.parse_args(argv)
    if args.cmd == "relabel":
        print(relabel(args.wheel, args.label, args.out))
    else:
        wheels = sorted(args.wheels.glob("*.whl"))
        if not wheels:
            print(f"no .whl files in {args.wheels}", file=sys.stderr)
            return 2
        print(write_index(wheels, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
