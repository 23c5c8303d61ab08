#!/usr/bin/env python3
"""GPU check of the CUDA build, for a machine WITH an NVIDIA GPU and no network.

One run, about 10 minutes including the build, always leaving JSON behind:
  1. env       nvidia-smi (GPU, compute capability, driver, memory), tools, Python modules
  2. sources   vendor/llama.cpp, from --carry's llama.cpp.tar.xz when the tree is missing
  3. build     the CUDA variant for this GPU's architecture only, into a venv that sees
               the system's packages: `pip install --no-build-isolation --no-deps`.
               With --carry holding a prebuilt libggml-cuda-*.so.xz (made by
               tools/cuda_compile_check.py), only the CPU part is built and that CUDA
               module is dropped into the package (minutes saved on the GPU machine).
  4. import    the backends that loaded (CUDA must have a device), devices, memory
  5. lossless  DFlash greedy == target greedy on the embedded pair, full offload
               (n_gpu_layers=-1), several prompts and draft lengths
  6. pytest    the repo's tests/test_backend_dl.py and tests/test_lossless.py against this
               build (if time is left)
  7. bench     target-only vs DFlash (tokens/s, tau, speed-up), full offload, on the
               embedded pair and on a synthetic memory-bound copy of its target (FFN
               zero-padded; identical outputs) sized to the GPU's memory
Each phase runs in a subprocess with a timeout taken from one overall budget; the JSON
(OUT/gpu_check.json) is rewritten after every phase, so a timeout keeps what was done.

    python3 tools/gpu_check.py --out "$OUT"                       # on the GPU machine
    python3 tools/gpu_check.py --out "$OUT" --carry build/gpu-carry
    python3 tools/gpu_check.py --pack-carry [--prebuilt PATH.so.xz]   # here: makes build/gpu-carry
    python3 tools/gpu_check.py --cpu-dry-run --out /tmp/x         # here: every step on the CPU
                                                                  # with the installed pydflash

Only the standard library in the orchestrator; the workers import pydflash (and numpy).
The synthetic target is written by a small GGUF rewriter here (numpy only), not by the
gguf package, which may be missing on the GPU machine.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor" / "llama.cpp"
PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
           "def parse_args(argv=None):"]
# Folders of vendor/llama.cpp that building pydflash does not need (for --pack-carry).
SOURCE_SKIP = {"models", "docs", "tools", "examples", "tests", "benches", "gguf-py", "scripts", "conversion",
               ".devops", ".github", "media", "grammars", "prompts", "requirements", "pocs", "licenses"}
GGML_SKIP = {"ggml-sycl", "ggml-vulkan", "ggml-opencl", "ggml-cann", "ggml-musa", "ggml-hip", "ggml-metal",
             "ggml-webgpu", "ggml-zdnn", "ggml-hexagon", "ggml-openvino", "ggml-zendnn", "ggml-virtgpu"}


# ---------------------------------------------------------------- orchestrator

class Run:
    def __init__(self, out: Path, budget: float):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.budget = budget
        self.res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}, "ok": None}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def save(self) -> None:
        self.res["elapsed_seconds"] = round(time.monotonic() - self.t0, 1)
        tmp = self.out / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.res, indent=2, default=str) + "\n")
        tmp.replace(self.out / "gpu_check.json")

    def phase(self, name: str, fn, *args, **kw):
        print(f"== {name} ({self.left():.0f} s of budget left)", flush=True)
        t = time.monotonic()
        rec: dict = {}
        self.res["phases"][name] = rec
        try:
            rec["result"] = fn(*args, **kw)
            rec["ok"] = True
        except Exception as e:  # keep going: later phases may still tell something
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"[-4000:]
            print(f"   {name} failed: {rec['error'][-1500:]}", flush=True)
        rec["seconds"] = round(time.monotonic() - t, 1)
        print(f"   {name}: {'ok' if rec['ok'] else 'FAILED'} in {rec['seconds']} s", flush=True)
        self.save()
        return rec.get("result")


def sh(cmd: list[str], timeout: float, env: dict | None = None, log: Path | None = None,
       cwd: Path | None = None) -> subprocess.CompletedProcess:
    if timeout <= 5:
        raise TimeoutError("no time left in the budget")
    print("   $ " + " ".join(cmd), flush=True)
    if log is None:
        return subprocess.run(cmd, env=env, cwd=cwd, text=True, capture_output=True, timeout=timeout)
    with open(log, "w") as f:
        try:
            return subprocess.run(cmd, env=env, cwd=cwd, text=True, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"timed out after {timeout:.0f} s; log {log}") from None


def query_env(dry: bool) -> dict:
    out: dict = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "dry_run": dry}
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                            "--format=csv,noheader,nounits"], text=True, capture_output=True, timeout=60)
        gpus = [dict(zip(("name", "compute_cap", "driver", "memory_mib"), [x.strip() for x in line.split(",")]))
                for line in p.stdout.strip().splitlines() if line.strip()] if p.returncode == 0 else []
        out["gpus"] = gpus
        if p.returncode != 0:
            out["nvidia_smi_error"] = (p.stderr or p.stdout).strip()[-500:]
    except (OSError, subprocess.TimeoutExpired) as e:
        out["gpus"] = []
        out["nvidia_smi_error"] = str(e)
    for tool, args in (("nvcc", ["--version"]), ("cmake", ["--version"]), ("ninja", ["--version"])):
        try:
            p = subprocess.run([tool, *args], text=True, capture_output=True, timeout=30)
            out[tool] = (p.stdout.strip().splitlines() or [""])[-1 if tool == "nvcc" else 0]
        except OSError:
            out[tool] = None
    mods = {}
    for m in ("numpy", "pytest", "scikit_build_core", "pybind11", "gguf"):
        p = subprocess.run([sys.executable, "-c", f"import {m}; print(getattr({m}, '__version__', '?'))"],
                           text=True, capture_output=True)
        mods[m] = p.stdout.strip() if p.returncode == 0 else None
    out["python_modules"] = mods
    out["nvidia_wheel_libs"] = nvidia_lib_dirs()
    if not dry and not out["gpus"]:
        raise RuntimeError("no NVIDIA GPU found by nvidia-smi (use --cpu-dry-run to test the script)")
    return out


def nvidia_lib_dirs() -> dict:
    """The nvidia-* wheels' cu13 folders visible to this Python (cuBLAS, runtime)."""
    code = ("import importlib.util, json; s = importlib.util.find_spec('nvidia'); "
            "print(json.dumps(list(s.submodule_search_locations) if s else []))")
    p = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True)
    roots = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
    found = {}
    for r in roots:
        for lib in ("libcublas.so.13", "libcublasLt.so.13", "libcudart.so.13"):
            if os.path.isfile(os.path.join(r, "cu13", "lib", lib)):
                found.setdefault(lib, os.path.join(r, "cu13"))
    return found


def arch_of(env: dict, explicit: str | None) -> str:
    if explicit:
        return explicit
    caps = sorted({g["compute_cap"].replace(".", "") for g in env.get("gpus", []) if g.get("compute_cap")})
    return ";".join(caps) if caps else "90"


def ensure_sources(carry: Path | None) -> dict:
    if (VENDOR / "CMakeLists.txt").is_file():
        return {"vendor": "present"}
    tarball = carry / "llama.cpp.tar.xz" if carry else None
    if tarball is None or not tarball.is_file():
        raise RuntimeError(f"{VENDOR} is missing and no llama.cpp.tar.xz in --carry (make it with --pack-carry)")
    VENDOR.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as t:
        t.extractall(VENDOR.parent)
    return {"vendor": f"extracted from {tarball}"}


def prebuilt_module(carry: Path | None, arch: str) -> Path | None:
    if carry is None:
        return None
    for pat in (f"libggml-cuda-sm{arch}.so.xz", f"libggml-cuda-sm{arch}.so"):
        hits = sorted(carry.glob(pat))
        if hits:
            return hits[0]
    return None


def cuda_toolkit_lib_dirs() -> list[str]:
    dirs = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(nvcc).resolve().parent.parent
        dirs += [str(home / "lib64"), str(home / "lib"), str(home / "targets" / "x86_64-linux" / "lib"),
                 str(home / "lib64" / "stubs"), str(home / "targets" / "x86_64-linux" / "lib" / "stubs")]
    return dirs


def make_venv(venv: Path, force_without_pip: bool = False) -> str:
    """A venv that sees the system's packages (numpy, pybind11, scikit-build-core, the
    nvidia wheels). Without ensurepip (Debian's python3 without python3-venv) it is made
    --without-pip and the system's pip, visible through the system site-packages, installs
    into it."""
    if (venv / "bin" / "python").exists():
        return "existing"
    if not force_without_pip:
        p = sh([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], 180)
        if p.returncode == 0:
            return "created"
        shutil.rmtree(venv, ignore_errors=True)
    sh([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], 60).check_returncode()
    p = sh([str(venv / "bin" / "python"), "-m", "pip", "--version"], 60)
    if p.returncode != 0:
        raise RuntimeError(f"no pip for the venv: {p.stderr[-500:]}")
    return "created --without-pip (system pip)"


def build(run: Run, env_info: dict, arch: str, carry: Path | None, venv: Path, build_root: Path,
          timeout: float, build_dir_override: Path | None = None) -> dict:
    info: dict = {"arch": arch}
    info["venv"] = make_venv(venv)
    py = str(venv / "bin" / "python")
    env = dict(os.environ)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(os.cpu_count() or 4)
    env.pop("CMAKE_ARGS", None)
    pre = prebuilt_module(carry, arch)
    cmake_args = []
    if pre is not None:
        info["prebuilt_cuda_module"] = str(pre)
        env["PYDFLASH_BACKEND_DL"] = "1"  # CPU part only; the CUDA module comes prebuilt
        build_dir = build_root / "gpu-dl-cpu"
    else:
        env["PYDFLASH_CUDA"] = "1"
        env["PYDFLASH_CUDA_ARCHITECTURES"] = arch
        build_dir = build_root / f"gpu-sm{arch.replace(';', '_')}"
        libdirs = cuda_toolkit_lib_dirs()
        if not any(os.path.exists(os.path.join(d, "libcublas.so")) for d in libdirs):
            cublas = env_info.get("nvidia_wheel_libs", {}).get("libcublas.so.13")
            if not cublas:
                raise RuntimeError("cuBLAS is neither in the CUDA toolkit nor in an nvidia-cublas wheel")
            env["PYDFLASH_CUBLAS_DIR"] = cublas
            info["cublas_from_wheel"] = cublas
        # VMM links libcuda.so; without an unversioned one (toolkit stubs or driver) use the legacy pool.
        has_libcuda = any(os.path.exists(os.path.join(d, "libcuda.so")) for d in
                          libdirs + ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64"])
        if not has_libcuda:
            cmake_args.append("-DGGML_CUDA_NO_VMM=ON")
        info["vmm"] = has_libcuda
    if cmake_args:
        env["CMAKE_ARGS"] = " ".join(cmake_args)
    if build_dir_override is not None:
        build_dir = build_dir_override
    info["build_dir"] = str(build_dir)
    log = run.out / "build.log"
    t = time.monotonic()
    try:
        p = sh([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "-v",
                f"-Cbuild-dir={build_dir}", str(ROOT)], timeout, env=env, log=log)
    finally:
        info["build_seconds"] = round(time.monotonic() - t, 1)
        info["build_log_tail"] = log.read_text()[-3000:] if log.exists() else ""
    if p.returncode != 0:
        raise RuntimeError(f"pip install failed ({p.returncode}); see build.log")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          text=True, capture_output=True).stdout.strip()
    lib = Path(site) / "pydflash" / "lib"
    if pre is not None:
        dst = lib / "libggml-cuda.so"
        if pre.suffix == ".xz":
            import lzma
            with lzma.open(pre) as src, open(dst, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)
        else:
            shutil.copy2(pre, dst)
        os.chmod(dst, 0o755)
    info["libs_mib"] = {f.name: round(f.stat().st_size / 2**20, 1) for f in sorted(lib.glob("*.so"))}
    return info


def worker(run: Run, py: str, task: str, timeout: float, extra: list[str]) -> dict:
    partial = run.out / f"{task}.partial.json"
    partial.unlink(missing_ok=True)
    cmd = [py, str(Path(__file__).resolve()), "--worker", task, "--partial", str(partial), *extra]
    cwd = run.out.parent if run.out.parent.exists() else Path("/")
    try:
        p = sh(cmd, timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        data = json.loads(partial.read_text()) if partial.exists() else {}
        data["timed_out"] = f"after {timeout:.0f} s"
        raise TimeoutError(json.dumps(data)) from None
    data = json.loads(partial.read_text()) if partial.exists() else {}
    data["stderr_tail"] = p.stderr[-2000:]
    if p.returncode != 0:
        raise RuntimeError(f"worker {task} exited {p.returncode}: {json.dumps(data)[-3000:]}")
    return data


def run_pytest(run: Run, py: str, timeout: float) -> dict:
    log = run.out / "pytest.log"
    try:
        p = sh([py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_backend_dl.py",
            "tests/test_lossless.py"], timeout,
               log=log, cwd=ROOT)
    finally:
        tail = log.read_text()[-1500:] if log.exists() else ""
    if p.returncode != 0:
        raise RuntimeError(f"pytest exited {p.returncode}: {tail}")
    return {"tail": tail}


def pack_carry(dest: Path, prebuilt: Path | None) -> dict:
    """build/gpu-carry/: a trimmed llama.cpp source tarball (+ a prebuilt CUDA module)."""
    if not (VENDOR / "CMakeLists.txt").is_file():
        raise SystemExit(f"{VENDOR} is missing")
    dest.mkdir(parents=True, exist_ok=True)

    def keep(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(ti.name).parts
        if len(parts) > 1 and parts[1] in SOURCE_SKIP:
            return None
        if len(parts) > 3 and parts[1] == "ggml" and parts[2] == "src" and parts[3] in GGML_SKIP:
            return None
        if ".git" in parts:
            return None
        return ti

    tarball = dest / "llama.cpp.tar.xz"
    with tarfile.open(tarball, "w:xz") as t:
        t.add(VENDOR, arcname="llama.cpp", filter=keep)
    out = {"llama.cpp.tar.xz_mib": round(tarball.stat().st_size / 2**20, 1)}
    if prebuilt is not None:
        shutil.copy2(prebuilt, dest / prebuilt.name)
        out[prebuilt.name + "_mib"] = round(prebuilt.stat().st_size / 2**20, 1)
    total = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    out["total_mib"] = round(total / 2**20, 1)
    return out


def orchestrate(a: argparse.Namespace) -> int:
    out = Path(a.out or os.environ.get("OUT") or ROOT / "build" / "gpu-check").resolve()
    run = Run(out, a.budget)
    work = (ROOT / "build").resolve()
    run.res["args"] = vars(a) | {"out": str(out)}
    run.save()
    env_info = run.phase("env", query_env, a.cpu_dry_run) or {}
    if not a.cpu_dry_run and not env_info.get("gpus"):
        run.res["ok"] = False
        run.save()
        return 1
    arch = arch_of(env_info, a.arch)
    py = sys.executable
    if not a.no_build:
        run.phase("sources", ensure_sources, a.carry)
        venv = (a.venv or work / "gpu-venv").resolve()
        b = run.phase("build", build, run, env_info, arch, a.carry, venv, work,
                      min(a.build_timeout, run.left() - 150), a.build_dir)
        if b is None:
            run.res["ok"] = False
            run.save()
            return 1
        py = str(venv / "bin" / "python")
    run.res["python"] = py
    common = ["--n-gpu-layers", str(a.n_gpu_layers)] + (["--dry-run"] if a.cpu_dry_run else [])
    imp = run.phase("import", worker, run, py, "import", min(120, run.left()), common)
    if imp is not None and not a.cpu_dry_run and not imp.get("cuda_devices"):
        run.res["phases"]["import"]["ok"] = False
        run.res["phases"]["import"]["error"] = "no CUDA device registered (see backend_load_errors)"
    run.phase("lossless", worker, run, py, "lossless", min(180, run.left() - 60), common)
    bench_reserve = 200 if not a.cpu_dry_run else 60
    if not a.no_pytest and run.left() - bench_reserve > 60:
        run.phase("pytest", run_pytest, run, py, min(150, run.left() - bench_reserve))
    else:
        run.res["phases"]["pytest"] = {"ok": None, "skipped": "no time left" if not a.no_pytest else "--no-pytest"}
    bench_args = common + ["--tokens", str(a.tokens), "--repeats", str(a.repeats), "--work", str(work)]
    if a.synthetic_gib is not None:
        bench_args += ["--synthetic-gib", str(a.synthetic_gib)]
    mem = [g.get("memory_mib") for g in env_info.get("gpus", [])]
    if mem and mem[0]:
        bench_args += ["--gpu-mib", str(mem[0])]
    run.phase("bench", worker, run, py, "bench", run.left() - 5, bench_args)
    req = ["env", "import", "lossless"] + ([] if a.no_build else ["build"])
    run.res["ok"] = all(run.res["phases"].get(k, {}).get("ok") for k in req)
    run.save()
    print(json.dumps({"ok": run.res["ok"], "elapsed_seconds": run.res["elapsed_seconds"],
                      "phases": {k: (v.get("ok"), v.get("seconds")) for k, v in run.res["phases"].items()}}))
    print(f"result: {out / 'gpu_check.json'}")
    return 0 if run.res["ok"] else 1


# ---------------------------------------------------------------- workers (import pydflash)

class Partial:
    """A worker's result, rewritten to disk after every piece (survives a timeout)."""

    def __init__(self, path: Path):
        self.path, self.data = path, {}

    def __setitem__(self, k, v):
        self.data[k] = v
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)

    def __getitem__(self, k):
        return self.data[k]


def llama_kwargs(n_gpu_layers: int) -> dict:
    import inspect

    from pydflash import Llama

    kw = {"n_gpu_layers": n_gpu_layers}
    if "draft_n_gpu_layers" in inspect.signature(Llama.__init__).parameters:
        kw["draft_n_gpu_layers"] = n_gpu_layers
    return kw


def memory_rows(llm) -> list:
    try:
        return [dict(role=r.role, buffer=r.buffer, model=r.model, context=r.context, compute=r.compute)
                for r in llm.memory().rows]
    except Exception as e:  # older builds
        return [f"memory() failed: {e}"]


def w_import(a, out: Partial) -> None:
    t = time.perf_counter()
    import pydflash
    from pydflash import _backends, _core

    out["import_seconds"] = round(time.perf_counter() - t, 3)
    out["file"] = pydflash.__file__
    out["dynamic_backends"] = _core.dynamic_backends()
    out["report"] = _core.backend_load_report()
    out["loaded"] = _core.loaded_backends()
    out["errors"] = _core.backend_load_errors()
    out["preloaded"] = _backends.preloaded
    out["devices"] = _core.devices()
    out["cuda_devices"] = [d for d in _core.devices() if str(d["name"]).startswith("CUDA")]
    out["supports_gpu_offload"] = _core.supports_gpu_offload()
    out["system_info"] = _core.system_info()
    target, draft = pydflash.embedded_pair()
    with pydflash.Llama(target, draft=draft, n_ctx=512, **llama_kwargs(a.n_gpu_layers)) as llm:
        out["memory"] = memory_rows(llm)


def w_lossless(a, out: Partial) -> None:
    import pydflash

    target, draft = pydflash.embedded_pair()
    kw = llama_kwargs(a.n_gpu_layers)
    n = 48 if a.dry_run else 128
    cases, refs = [], {}
    with pydflash.Llama(target, n_ctx=1024, **kw) as llm:
        for p in PROMPTS:
            refs[p] = llm.generate(p, max_tokens=n, ignore_eos=True).tokens
    with pydflash.Llama(target, n_ctx=1024, n_gpu_layers=0) as cpu:
        cpu_ref = {p: cpu.generate(p, max_tokens=n, ignore_eos=True).tokens for p in PROMPTS}
    # GPU kernels round differently from the CPU's: informational, not a failure.
    out["target_gpu_vs_cpu_equal"] = {p: refs[p] == cpu_ref[p] for p in PROMPTS}
    with pydflash.Llama(target, draft=draft, n_ctx=1024, **kw) as llm:
        out["memory"] = memory_rows(llm)
        max_draft = llm.pair.max_draft
        for dm in sorted({1, 2, 4, 8, max_draft} & set(range(1, max_draft + 1))) + [None]:
            for p in PROMPTS:
                r = llm.generate(p, max_tokens=n, ignore_eos=True, draft_max=dm)
                cases.append({"prompt": p, "draft_max": dm, "equal": r.tokens == refs[p],
                              "tau": round(r.stats.mean_accepted_length, 3)})
                out["cases"] = cases
    out["n_tokens"] = n
    out["all_equal"] = all(c["equal"] for c in cases)
    if not out["all_equal"]:
        raise SystemExit("DFlash greedy output differs from the target's greedy output")


def _bench_pair(target: str, draft: str, a, label: str, out: Partial) -> dict:
    import pydflash

    kw = llama_kwargs(a.n_gpu_layers)
    n_ctx = 1024 if a.tokens <= 768 else 4096
    res: dict = {"label": label, "tokens": a.tokens, "repeats": a.repeats}
    for name, d in (("target_only", None), ("dflash", draft)):
        t = time.perf_counter()
        with pydflash.Llama(target, draft=d, n_ctx=n_ctx, **kw) as llm:
            res[f"{name}_load_seconds"] = round(time.perf_counter() - t, 2)
            llm.generate(PROMPTS[0], max_tokens=16, ignore_eos=True)  # warm-up
            tps, taus, toks = [], [], []
            for i in range(a.repeats):
                r = llm.generate(PROMPTS[i % len(PROMPTS)], max_tokens=a.tokens, ignore_eos=True)
                tps.append(r.stats.decode_tokens_per_second)
                taus.append(r.stats.mean_accepted_length)
                toks.append(r.tokens)
            res[name] = {"tokens_per_second": [round(x, 1) for x in tps],
                         "median_tokens_per_second": round(statistics.median(tps), 1),
                         "tau": round(statistics.median(taus), 3)}
            res[f"{name}_tokens"] = toks
            if name == "target_only":
                res["memory_target_only"] = memory_rows(llm)
        out[label] = res
    res["dflash_equals_target"] = res.pop("dflash_tokens") == res.pop("target_only_tokens")
    res["speedup"] = round(res["dflash"]["median_tokens_per_second"]
                           / max(res["target_only"]["median_tokens_per_second"], 1e-9), 3)
    out[label] = res
    return res


def w_bench(a, out: Partial) -> None:
    import pydflash

    target, draft = pydflash.embedded_pair()
    out["embedded"] = {"status": "running"}
    _bench_pair(target, draft, a, "embedded", out)
    # Synthetic memory-bound target: ~3% of the GPU's memory (1..8 GiB) of FFN weights in F16.
    gib = a.synthetic_gib
    if gib is None:
        gib = min(8.0, max(1.0, 0.03 * a.gpu_mib / 1024)) if a.gpu_mib else 1.0
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    dst = work / "synthetic-target.gguf"
    t = time.perf_counter()
    info = pad_gguf_ffn(target, dst, target_bytes=int(gib * 2**30))
    info["write_seconds"] = round(time.perf_counter() - t, 1)
    out["synthetic_model"] = info
    try:
        _bench_pair(str(dst), draft, a, "synthetic", out)
    finally:
        dst.unlink(missing_ok=True)


# ---------------------------------------------------------------- GGUF FFN padding (numpy only)

_GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGML_BYTES = {0: 4, 1: 2}  # F32, F16


def _read_str(b: bytes, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", b, pos)
    return b[pos + 8:pos + 8 + n].decode("utf-8", "replace"), pos + 8 + n


def _skip_value(b: bytes, pos: int, vtype: int) -> int:
    if vtype == 8:
        return _read_str(b, pos)[1]
    if vtype == 9:
        sub, count = struct.unpack_from("<IQ", b, pos)
        pos += 12
        if sub in _GGUF_SCALAR:
            return pos + count * struct.calcsize(_GGUF_SCALAR[sub])
        for _ in range(count):
            pos = _skip_value(b, pos, sub)
        return pos
    return pos + struct.calcsize(_GGUF_SCALAR[vtype])


def pad_gguf_ffn(src: str, dst: Path, target_bytes: int, align_ff: int = 256) -> dict:
    """Copy a qwen3/llama-style GGUF (F32/F16 tensors) with its FFN zero-padded so that
    the FFN weights (stored F16) take about ``target_bytes``. Outputs are unchanged:
    silu(0) * 0 = 0 and the extra columns of ffn_down multiply zeros. Streams the
    zeros, so memory stays small whatever the size."""
    import numpy as np

    with open(src, "rb") as f:
        head = f.read(64 << 20)  # metadata + tensor infos are far smaller
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", head, 0)
    if magic != b"GGUF" or version < 2:
        raise ValueError("not a GGUF v2+ file")
    pos = 24
    kv_start = pos
    arch, align, ff_pos, n_embd, n_layer = None, 32, None, None, None
    kvs = {}
    for _ in range(n_kv):
        key, pos = _read_str(head, pos)
        (vtype,) = struct.unpack_from("<I", head, pos)
        pos += 4
        if vtype in _GGUF_SCALAR:
            kvs[key] = (vtype, pos)
        elif vtype == 8:
            kvs[key] = (vtype, _read_str(head, pos)[0])
        pos = _skip_value(head, pos, vtype)
    kv_end = pos
    arch = kvs["general.architecture"][1]

    def scalar(key):
        vt, p = kvs[key]
        return struct.unpack_from(_GGUF_SCALAR[vt], head, p)[0]

    if "general.alignment" in kvs:
        align = scalar("general.alignment")
    ff_type, ff_pos = kvs[f"{arch}.feed_forward_length"]
    old_ff, n_embd, n_layer = scalar(f"{arch}.feed_forward_length"), scalar(f"{arch}.embedding_length"), \
        scalar(f"{arch}.block_count")
    n_ff = max(old_ff, target_bytes // (n_layer * 3 * n_embd * 2) // align_ff * align_ff)
    tensors = []
    for _ in range(n_tensors):
        name, pos = _read_str(head, pos)
        (nd,) = struct.unpack_from("<I", head, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", head, pos + 4))
        ttype, off = struct.unpack_from("<IQ", head, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        if ttype not in _GGML_BYTES:
            raise ValueError(f"{name}: only F32/F16 tensors can be padded (type {ttype})")
        tensors.append({"name": name, "dims": dims, "type": ttype, "off": off})
    data_start = (pos + align - 1) // align * align

    kv = bytearray(head[kv_start:kv_end])
    struct.pack_into(_GGUF_SCALAR[ff_type], kv, ff_pos - kv_start, n_ff)
    # New layout: FFN matrices become F16 with n_ff in place of old_ff.
    plan, off = [], 0
    for t in tensors:
        n = t["name"]
        dims, ttype, kind = list(t["dims"]), t["type"], None
        if n.endswith(("ffn_gate.weight", "ffn_up.weight")):
            kind, dims, ttype = "rows", [dims[0], n_ff], 1
        elif n.endswith("ffn_down.weight"):
            kind, dims, ttype = "cols", [n_ff, dims[1]], 1
        size = _GGML_BYTES[ttype]
        for d in dims:
            size *= d
        plan.append((t, dims, ttype, kind, off, size))
        off = (off + size + align - 1) // align * align
    infos = bytearray()
    for t, dims, ttype, _, o, _ in plan:
        nb = t["name"].encode()
        infos += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ttype, o)
    zeros = bytes(16 << 20)

    def write_zeros(f, n: int) -> None:
        while n > 0:
            k = min(n, len(zeros))
            f.write(zeros[:k])
            n -= k

    with open(src, "rb") as fin, open(dst, "wb") as f:
        f.write(head[:kv_start])
        f.write(kv)
        f.write(infos)
        hdr = kv_start + len(kv) + len(infos)
        write_zeros(f, (hdr + align - 1) // align * align - hdr)
        base = f.tell()
        for t, dims, ttype, kind, o, size in plan:
            write_zeros(f, base + o - f.tell())
            count = 1
            for d in t["dims"]:
                count *= d
            fin.seek(data_start + t["off"])
            arr = np.frombuffer(fin.read(count * _GGML_BYTES[t["type"]]),
                                dtype=np.float32 if t["type"] == 0 else np.float16)
            if kind is None:
                f.write(arr.tobytes())
            elif kind == "rows":  # ne = [n_embd, ff]: rows of n_embd; append zero rows
                f.write(arr.astype(np.float16).tobytes())
                write_zeros(f, (n_ff - old_ff) * t["dims"][0] * 2)
            else:  # ffn_down, ne = [ff, n_embd]: each of n_embd rows gets zero columns
                rows = arr.astype(np.float16).reshape(t["dims"][1], t["dims"][0])
                pad = (n_ff - old_ff) * 2
                for r in rows:
                    f.write(r.tobytes())
                    write_zeros(f, pad)
        write_zeros(f, base + off - f.tell())
    return {"arch": arch, "n_embd": n_embd, "n_layer": n_layer, "n_ff": n_ff, "old_n_ff": old_ff,
            "ffn_bytes": n_layer * 3 * n_embd * n_ff * 2, "file_mib": round(dst.stat().st_size / 2**20, 1)}


def worker_main(a: argparse.Namespace) -> int:
    out = Partial(Path(a.partial))
    fn = {"import": w_import, "lossless": w_lossless, "bench": w_bench}[a.worker]
    fn(a, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="result folder (default $OUT, else build/gpu-check)")
    ap.add_argument("--arch", default=None, help="CUDA architecture(s) (default: nvidia-smi's compute_cap)")
    ap.add_argument("--carry", type=Path, default=None,
                    help="folder with llama.cpp.tar.xz and/or a prebuilt libggml-cuda-sm<arch>.so[.xz]")
    ap.add_argument("--budget", type=float, default=570, help="seconds for the whole run (default 570)")
    ap.add_argument("--build-timeout", type=float, default=420)
    ap.add_argument("--no-build", action="store_true", help="use the pydflash this Python imports")
    ap.add_argument("--venv", type=Path, default=None,
                    help="install into this venv (default: create build/gpu-venv with system site-packages)")
    ap.add_argument("--build-dir", type=Path, default=None, help="scikit-build build folder (default build/gpu-*)")
    ap.add_argument("--no-pytest", action="store_true")
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--tokens", type=int, default=256, help="tokens per bench generation")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--synthetic-gib", type=float, default=None,
                    help="FFN bytes of the synthetic target (default: 3%% of GPU memory, 1..8 GiB)")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="no GPU: test every step on the CPU (implies --no-build unless --build; small sizes)")
    ap.add_argument("--build", action="store_true", help="with --cpu-dry-run: build anyway")
    ap.add_argument("--pack-carry", action="store_true", help="make build/gpu-carry for a GPU machine and exit")
    ap.add_argument("--prebuilt", type=Path, default=None, help="with --pack-carry: a libggml-cuda-sm*.so.xz")
    # worker mode (internal)
    ap.add_argument("--worker", choices=["import", "lossless", "bench"], help=argparse.SUPPRESS)
    ap.add_argument("--partial", help=argparse.SUPPRESS)
    ap.add_argument("--dry-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--gpu-mib", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a)
    if a.pack_carry:
        print(json.dumps(pack_carry(ROOT / "build" / "gpu-carry", a.prebuilt), indent=2))
        return 0
    if a.cpu_dry_run:
        a.no_build = a.no_build or not a.build
        if a.synthetic_gib is None:
            a.synthetic_gib = 0.06
        if a.tokens == 256:
            a.tokens = 32
        if a.repeats == 3:
            a.repeats = 1
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
