#!/usr/bin/env python3
"""Fetch the pinned llama.cpp tree into vendor/llama.cpp.

llama.cpp at upstream commit 0c1e57098 is shipped inside the source
distribution of llama-cpp-python 0.3.36. We fetch that sdist with pip (by
package name, so no host name lives in this repository), check its sha256,
and extract only its ``vendor/llama.cpp`` folder (minus models/ and docs/,
which the build does not need). A VENDORED.json file records what was fetched.

Usage: python tools/fetch_llama_cpp.py [--dest vendor/llama.cpp] [--force]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
UPSTREAM_COMMIT = "0c1e57098"
PREFIX = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
# Not needed to build; dropping them saves ~110 MB.
SKIP_DIRS = ("models/", "docs/", "media/", ".github/", "gguf-py/tests/")
MARKER = "VENDORED.json"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--no-build-isolation", f"{PACKAGE}=={VERSION}", "-d", str(workdir)]
    try:
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    except subprocess.CalledProcessError:
        # --no-build-isolation fails where scikit-build-core is not importable; retry isolated.
        cmd.remove("--no-build-isolation")
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    path = workdir / SDIST
    if not path.is_file():
        raise SystemExit(f"pip did not produce {SDIST} in {workdir}")
    return path


def extract(sdist: Path, dest: Path) -> int:
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n = 0
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if not member.name.startswith(PREFIX):
                continue
            rel = member.name[len(PREFIX):]
            # .git is a gitlink file: keep it out or git sees a submodule.
            if not rel or rel == ".git" or rel.startswith(SKIP_DIRS):
                continue
            if not (member.isfile() or member.isdir()):
                continue  # no links or devices from an archive
            target = (tmp / rel).resolve()
            if not str(target).startswith(str(tmp.resolve())):
                raise SystemExit(f"unsafe path in archive: {member.name}")
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
            target.chmod(member.mode & 0o755 | 0o644)
            n += 1
    if n == 0:
        raise SystemExit(f"{SDIST} holds no {PREFIX}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parent.parent
    ap.add_argument("--dest", type=Path, default=root / "vendor" / "llama.cpp")
    ap.add_argument("--sdist", type=Path, help="use this already-downloaded sdist")
    ap.add_argument("--force", action="store_true", help="fetch even if present")
    args = ap.parse_args(argv)
    dest: Path = args.dest.resolve()

    if (dest / MARKER).is_file() and not args.force:
        print(f"llama.cpp already vendored in {dest}", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="pydflash-fetch-") as td:
        sdist = args.sdist or download(Path(td))
        digest = sha256_of(sdist)
        if digest != SHA256:
            raise SystemExit(f"sha256 mismatch for {sdist}: {digest} != {SHA256}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        n = extract(sdist, dest)
    record = {"package": PACKAGE, "version": VERSION, "file": SDIST, "sha256": SHA256,
              "folder": PREFIX.rstrip("/"), "upstream_commit": UPSTREAM_COMMIT,
              "files": n, "skipped": list(SKIP_DIRS)}
    (dest / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    print(f"vendored llama.cpp {UPSTREAM_COMMIT} ({n} files) into {dest}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
