#!/usr/bin/env python3
"""Build llama.cpp's own DFlash loop, `llama-speculative-simple`, and its
server, `llama-server`, from the vendored tree (the same commit pydflash
links), for `pydflash bench`'s native engines and the tests that compare
steps with them. llama-speculative-simple gets one object of ours,
tools/native/flush_log_at_exit.cpp, which only flushes its log at exit (its
loop is llama.cpp's). The binaries go to build/native/bin/ (git-ignored;
never committed). A clean build takes ~10 minutes on 2 cores (llama, ggml,
common), the server a few more.

    python tools/build_native.py [--src vendor/llama.cpp] [--build build/native] [--target NAME ...]

With --reuse it builds nothing: it copies the two programs that an extension build
made with PYDFLASH_NATIVE_TOOLS=1 (`PYDFLASH_NATIVE_TOOLS=1 pip install .`, what CI
does) from that build's folder, so llama.cpp is compiled once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["llama-speculative-simple", "llama-server"]


def _launcher() -> list[str]:
    cache = shutil.which("ccache")
    if cache is None or os.environ.get("PYDFLASH_CCACHE") == "0":
        return []
    return [f"-DCMAKE_C_COMPILER_LAUNCHER={cache}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={cache}"]


def build(src: Path, build_dir: Path, jobs: int | None = None, targets: list[str] | None = None) -> Path:
    if not (src / "CMakeLists.txt").is_file():
        raise SystemExit(f"{src} is not a llama.cpp tree (run tools/fetch_llama_cpp.py or pip install . first)")
    subprocess.run([sys.executable, str(ROOT / "tools" / "patch_llama_cpp.py"), "--src", str(src)], check=True)
    configure = ["cmake", "-S", str(src), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                 # the extension's flags where they do not matter here (a compiler cache still
                 # misses its objects: their include paths and working directories differ)
                 "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", "-DGGML_RPC=ON", "-DGGML_ALL_WARNINGS=OFF",
                 "-DLLAMA_ALL_WARNINGS=OFF", *_launcher(),
                 "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_COMMON=ON",
                 "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=ON",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_OPENSSL=OFF",
                 # flush the logger at exit, or a loaded machine loses the run's figures
                 f"-DCMAKE_PROJECT_llama.cpp_INCLUDE={ROOT / 'tools' / 'native' / 'flush_log.cmake'}"]
    # configure every time (seconds): a build directory made before an option
    # here changed takes it up
    subprocess.run(configure, check=True)
    targets = targets or TARGETS
    cmd = ["cmake", "--build", str(build_dir), "--target", *targets]
    if jobs:
        cmd += ["-j", str(jobs)]
    subprocess.run(cmd, check=True)
    return build_dir / "bin" / targets[0]


def reuse(build_root: Path, dest: Path) -> Path:
    """Copy the programs of the newest extension build folder under `build_root`
    (scikit-build-core's build/<wheel tag>/bin) that has them all into `dest`."""
    found = [d for d in build_root.glob("*/bin") if d.parent != dest.parent
             and all(os.access(d / t, os.X_OK) for t in TARGETS)]
    if not found:
        raise SystemExit(f"no extension build under {build_root} has {' and '.join(TARGETS)}: "
                         "install with PYDFLASH_NATIVE_TOOLS=1 first (pip builds them with the extension)")
    src = max(found, key=lambda d: (d / TARGETS[0]).stat().st_mtime)
    dest.mkdir(parents=True, exist_ok=True)
    for t in TARGETS:
        shutil.copy2(src / t, dest / t)
    print(f"copied {', '.join(TARGETS)} from {src}")
    return dest / TARGETS[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT / "vendor" / "llama.cpp")
    ap.add_argument("--build", type=Path, default=ROOT / "build" / "native")
    ap.add_argument("-j", "--jobs", type=int)
    ap.add_argument("--target", action="append", choices=TARGETS, help="build only this one (repeatable)")
    ap.add_argument("--reuse", action="store_true",
                    help="copy the programs an extension build made with PYDFLASH_NATIVE_TOOLS=1; build nothing")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    if a.reuse:
        reuse(ROOT / "build", a.build / "bin")
        return 0
    exe = build(a.src, a.build, a.jobs, a.target)
    print(f"built {exe} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
