#!/usr/bin/env python3
"""Compile check of the CUDA build on a machine WITHOUT a GPU (not in default CI: slow).

Builds the CUDA variant (dynamic ggml backends, PYDFLASH_CUDA=1) for ONE architecture
in its own build folder, then checks on this machine:
  - the wheel holds _core, the shared llama/ggml libraries and the backend modules
    (libggml-cpu.so, libggml-cuda.so), with RPATH $ORIGIN and no unversioned copies;
  - `import pydflash` works from outside the source tree, prints nothing, loads the CPU
    backend from the package folder, and the CUDA backend fails cleanly (no driver/GPU):
    once with the cuda extra's wheels (CUDA runtime + cuBLAS) installed beside it, and
    once without them;
  - generation falls back to the CPU: DFlash greedy output == target greedy output on
    the embedded pair, asking for full offload (n_gpu_layers=-1).
Prints and writes (JSON) the elapsed time of each phase.

cuBLAS: a CUDA toolkit without cuBLAS (these machines) gets it from the nvidia-cublas
wheel, downloaded with pip into the work folder (PYDFLASH_CUBLAS_DIR); libcuda is not
needed at link time with -DGGML_CUDA_NO_VMM=ON (the default here; --vmm to link it).

    nice -n 10 python tools/cuda_compile_check.py [--arch 90] [--work build/cuda-check]

Cost measured on a 2-core machine: see README ("CUDA"). Everything it writes is under
--work (git-ignored build/).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The wheels matching nvcc 13.0 (the cuda extra accepts any 13.x at run time).
CUBLAS_WHEEL = "nvidia-cublas==13.0.2.14"
CUDART_WHEEL = "nvidia-cuda-runtime==13.0.96"


class Check:
    def __init__(self, out_json: Path):
        self.out_json = out_json
        self.result: dict = {"phases": {}, "checks": {}, "ok": None, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.t0 = time.monotonic()

    def phase(self, name: str, fn, *args, **kw):
        print(f"== {name}", flush=True)
        t = time.monotonic()
        try:
            value = fn(*args, **kw)
            ok = True
        except Exception as e:  # recorded, then re-raised by main's handler
            value, ok = None, False
            self.result["phases"][name] = {"seconds": round(time.monotonic() - t, 1), "ok": False, "error": str(e)}
            self.save()
            raise
        secs = round(time.monotonic() - t, 1)
        self.result["phases"][name] = {"seconds": secs, "ok": ok}
        print(f"   {name}: {secs:.1f} s", flush=True)
        self.save()
        return value

    def check(self, name: str, cond: bool, detail=None) -> None:
        self.result["checks"][name] = {"ok": bool(cond), "detail": detail}
        print(f"   [{'ok' if cond else 'FAIL'}] {name}" + (f": {detail}" if detail not in (None, "") else ""),
              flush=True)
        self.save()

    def save(self) -> None:
        self.result["total_seconds"] = round(time.monotonic() - self.t0, 1)
        self.out_json.parent.mkdir(parents=True, exist_ok=True)
        self.out_json.write_text(json.dumps(self.result, indent=2) + "\n")


def run(cmd: list[str], log: Path | None = None, env: dict | None = None, cwd: Path | None = None) -> str:
    print("   $ " + " ".join(cmd), flush=True)
    if log is None:
        p = subprocess.run(cmd, env=env, cwd=cwd, text=True, capture_output=True)
        if p.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {(p.stdout + p.stderr)[-3000:]}")
        return p.stdout
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, cwd=cwd, text=True, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({p.returncode}); log: {log}\n{log.read_text()[-3000:]}")
    return ""


def fetch_wheels(work: Path) -> dict:
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for spec in (CUBLAS_WHEEL, CUDART_WHEEL):
        name = spec.split("==")[0].replace("-", "_")
        if not glob.glob(str(wheels / f"{name}-*.whl")):
            run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), spec])
    cublas_whl = glob.glob(str(wheels / "nvidia_cublas-*.whl"))[0]
    cublas = work / "cublas"
    if not (cublas / "nvidia" / "cu13" / "lib").is_dir():
        with zipfile.ZipFile(cublas_whl) as z:
            z.extractall(cublas)
    return {"wheels": sorted(os.path.basename(w) for w in glob.glob(str(wheels / "*.whl"))),
            "cublas_dir": str(cublas / "nvidia" / "cu13")}


def build_wheel(work: Path, arch: str, vmm: bool, cublas_dir: str) -> dict:
    dist = work / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    env = dict(os.environ)
    env.update({"PYDFLASH_CUDA": "1", "PYDFLASH_CUDA_ARCHITECTURES": arch, "PYDFLASH_CUBLAS_DIR": cublas_dir})
    env.pop("PYDFLASH_BACKEND_DL", None)
    if not vmm:
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DGGML_CUDA_NO_VMM=ON").strip()
    build_dir = work / "build"
    run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", str(dist),
         f"-Cbuild-dir={build_dir}", str(ROOT)], log=work / "build.log", env=env)
    whl = glob.glob(str(dist / "pydflash-*.whl"))[0]
    info = {"wheel": whl, "wheel_mib": round(os.path.getsize(whl) / 2**20, 1), "build_log": str(work / "build.log")}
    info.update(ninja_times(build_dir))
    return info


def ninja_times(build_dir: Path) -> dict:
    """Per-target compile times from .ninja_log (the last build of each output)."""
    log = build_dir / ".ninja_log"
    if not log.is_file():
        return {}
    last: dict[str, tuple[int, int]] = {}
    for line in log.read_text().splitlines()[1:]:
        parts = line.split("\t")
        if len(parts) >= 4:
            last[parts[3]] = (int(parts[0]), int(parts[1]))
    def span(pred) -> dict:
        items = [v for k, v in last.items() if pred(k)]
        if not items:
            return {"files": 0}
        return {"files": len(items), "cpu_seconds": round(sum(e - s for s, e in items) / 1000, 1),
                "wall_seconds": round((max(e for _, e in items) - min(s for s, _ in items)) / 1000, 1)}
    return {"ninja": {"all": span(lambda k: True),
                      "ggml_cuda": span(lambda k: "ggml-cuda" in k),
                      "other": span(lambda k: "ggml-cuda" not in k)}}


def inspect_wheel(c: Check, whl: str) -> dict:
    with zipfile.ZipFile(whl) as z:
        files = {i.filename: i.file_size for i in z.infolist()}
    libs = {k: round(v / 2**20, 1) for k, v in files.items() if k.endswith(".so") or ".so." in k}
    c.check("wheel has _core and lib/ with llama, ggml, ggml-base, backends",
            all(any(k.endswith(n) for k in files) for n in
                ("pydflash/lib/libllama.so", "pydflash/lib/libllama-common.so", "pydflash/lib/libggml.so",
                 "pydflash/lib/libggml-base.so", "pydflash/lib/libggml-cpu.so", "pydflash/lib/libggml-cuda.so"))
            and any(k.startswith("pydflash/_core") for k in files), libs)
    c.check("no versioned duplicates of the libraries", not any(".so." in k for k in files))
    return {"libraries_mib": libs}


def install(work: Path, whl: str, with_cuda_wheels: bool) -> Path:
    site = work / ("site-cuda" if with_cuda_wheels else "site-plain")
    shutil.rmtree(site, ignore_errors=True)
    extra = sorted(glob.glob(str(work / "wheels" / "*.whl"))) if with_cuda_wheels else []
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), whl, *extra])
    return site


def elf_info(c: Check, site: Path) -> dict:
    lib = site / "pydflash" / "lib"
    out = {}
    for f in sorted(lib.glob("*.so")) + sorted((site / "pydflash").glob("_core*.so")):
        dyn = run(["readelf", "-d", str(f)])
        needed = [l.split("[")[1].rstrip("]") for l in dyn.splitlines() if "(NEEDED)" in l]
        rpath = [l.split("[")[1].rstrip("]") for l in dyn.splitlines() if "RUNPATH" in l or "(RPATH)" in l]
        out[f.name] = {"needed": needed, "runpath": rpath, "mib": round(f.stat().st_size / 2**20, 1)}
    core = next(v for k, v in out.items() if k.startswith("_core"))
    c.check("_core RUNPATH is $ORIGIN/lib", core["runpath"] == ["$ORIGIN/lib"], core["runpath"])
    cuda = out.get("libggml-cuda.so", {})
    c.check("libggml-cuda.so needs the CUDA 13 runtime and cuBLAS",
            {"libcudart.so.13", "libcublas.so.13"} <= set(cuda.get("needed", [])), cuda.get("needed"))
    return out


PROBE = textwrap.dedent("""
    import json, os, sys, time
    t = time.perf_counter()
    import pydflash
    from pydflash import _core, _backends
    t_import = time.perf_counter() - t
    out = {"file": pydflash.__file__, "import_seconds": round(t_import, 3),
           "dynamic": _core.dynamic_backends(), "report": _core.backend_load_report(),
           "loaded": _core.loaded_backends(), "errors": _core.backend_load_errors(),
           "preloaded": _backends.preloaded, "devices": _core.devices(),
           "gpu_offload": _core.supports_gpu_offload()}
    if len(sys.argv) > 1:
        target, draft = pydflash.embedded_pair()
        prompt, n = "def fibonacci(n):", int(sys.argv[1])
        t = time.perf_counter()
        with pydflash.Llama(target, n_gpu_layers=-1, seed=0) as llm:
            ref = llm.generate(prompt, max_tokens=n, ignore_eos=True).tokens
        with pydflash.Llama(target, draft=draft, n_gpu_layers=-1, seed=0) as llm:
            res = llm.generate(prompt, max_tokens=n, ignore_eos=True)
        out["generate"] = {"n": n, "equal": res.tokens == ref, "target_tokens": ref, "dflash_tokens": res.tokens,
                           "tau": res.stats.mean_accepted_length, "seconds": round(time.perf_counter() - t, 2)}
    print("PROBE-JSON " + json.dumps(out))
""")


def probe(site: Path, work: Path, n_tokens: int = 0) -> tuple[dict, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    env.pop("LD_LIBRARY_PATH", None)
    cwd = work / "cwd"  # not the source tree: the installed package must be the one imported
    cwd.mkdir(exist_ok=True)
    args = [sys.executable, "-c", PROBE] + ([str(n_tokens)] if n_tokens else [])
    p = subprocess.run(args, env=env, cwd=cwd, text=True, capture_output=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"probe failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    line = next(l for l in p.stdout.splitlines() if l.startswith("PROBE-JSON "))
    return json.loads(line[len("PROBE-JSON "):]), p.stderr


def check_probe(c: Check, tag: str, site: Path, data: dict, stderr: str) -> None:
    c.check(f"{tag}: imported the installed package", data["file"].startswith(str(site)), data["file"])
    c.check(f"{tag}: dynamic backends build", data["dynamic"] is True)
    c.check(f"{tag}: nothing on stderr at import", stderr.strip() == "", stderr.strip()[-500:])
    cpu = [b for b in data["report"] if b["name"] == "CPU"]
    c.check(f"{tag}: CPU backend loaded from the package folder",
            bool(cpu) and cpu[0]["loaded"] and cpu[0]["n_devices"] >= 1
            and cpu[0]["path"] == str(site / "pydflash" / "lib" / "libggml-cpu.so"), cpu)
    cuda = [b for b in data["report"] if b["path"].endswith("libggml-cuda.so")]
    c.check(f"{tag}: CUDA backend tried, no device, reason recorded",
            bool(cuda) and cuda[0]["n_devices"] == 0 and cuda[0]["error"] != "", cuda)
    c.check(f"{tag}: only CPU devices", [d["name"] for d in data["devices"]] == ["CPU"], data["devices"])


def pack_cuda_module(work: Path, site: Path, arch: str) -> dict:
    """A stripped, xz-compressed copy of libggml-cuda.so (for a GPU machine's carry limit)."""
    src = site / "pydflash" / "lib" / "libggml-cuda.so"
    dst = work / f"libggml-cuda-sm{arch.replace(';', '_')}.so"
    shutil.copy2(src, dst)
    run(["strip", "--strip-unneeded", str(dst)])
    run(["xz", "-9", "-T0", "-f", "-k", str(dst)])
    xz = Path(str(dst) + ".xz")
    return {"stripped": str(dst), "stripped_mib": round(dst.stat().st_size / 2**20, 1),
            "xz": str(xz), "xz_mib": round(xz.stat().st_size / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="90", help="CUDA architecture(s) (default 90, Hopper)")
    ap.add_argument("--work", type=Path, default=ROOT / "build" / "cuda-check", help="work folder (build, wheels)")
    ap.add_argument("--json", type=Path, default=None, help="result JSON (default WORK/compile_check.json)")
    ap.add_argument("--vmm", action="store_true", help="link libcuda (CUDA VMM pool); needs libcuda.so to link")
    ap.add_argument("--skip-build", action="store_true", help="reuse WORK/dist's wheel")
    ap.add_argument("--tokens", type=int, default=24, help="tokens generated by the CPU-fallback check")
    ap.add_argument("--no-pack", action="store_true", help="skip the stripped/xz copy of libggml-cuda.so")
    a = ap.parse_args(argv)
    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    c = Check(a.json or work / "compile_check.json")
    r = c.result
    r.update({"arch": a.arch, "vmm": a.vmm, "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}})
    try:
        r["nvcc"] = run(["nvcc", "--version"]).strip().splitlines()[-1]
        r["fetch"] = c.phase("fetch_cuda_wheels", fetch_wheels, work)
        if a.skip_build:
            whl = glob.glob(str(work / "dist" / "pydflash-*.whl"))[0]
            r["build"] = {"wheel": whl, "skipped": True}
        else:
            r["build"] = c.phase("build_wheel", build_wheel, work, a.arch, a.vmm, r["fetch"]["cublas_dir"])
            whl = r["build"]["wheel"]
        r["wheel"] = inspect_wheel(c, whl)
        site_cuda = c.phase("install_with_cuda_wheels", install, work, whl, True)
        site_plain = c.phase("install_without_cuda_wheels", install, work, whl, False)
        r["elf"] = elf_info(c, site_cuda)
        data, err = c.phase("import_with_cuda_wheels", probe, site_cuda, work)
        r["import_with_cuda_wheels"] = data
        check_probe(c, "with cuda wheels", site_cuda, data, err)
        c.check("with cuda wheels: CUDA runtime and cuBLAS preloaded from the wheels",
                len(data["preloaded"]) == 3, data["preloaded"])
        data, err = c.phase("import_without_cuda_wheels", probe, site_plain, work)
        r["import_without_cuda_wheels"] = data
        check_probe(c, "without cuda wheels", site_plain, data, err)
        data, err = c.phase("generate_cpu_fallback", probe, site_cuda, work, a.tokens)
        r["generate_cpu_fallback"] = data.get("generate")
        c.check("CPU fallback: DFlash greedy == target greedy (n_gpu_layers=-1)",
                data["generate"]["equal"], {k: data["generate"][k] for k in ("n", "tau", "seconds")})
        if not a.no_pack:
            r["packed_cuda_module"] = c.phase("pack_cuda_module", pack_cuda_module, work, site_cuda, a.arch)
    except Exception as e:
        r["error"] = str(e)[-4000:]
        print(f"ERROR: {e}", file=sys.stderr)
    r["ok"] = "error" not in r and all(v["ok"] for v in r["checks"].values())
    c.save()
    print(json.dumps({"ok": r["ok"], "total_seconds": r["total_seconds"],
                      "phases": {k: v["seconds"] for k, v in r["phases"].items()}}, indent=2))
    print(f"result: {c.out_json}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
