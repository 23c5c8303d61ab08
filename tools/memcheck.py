#!/usr/bin/env python3
"""Run a pydflash workload under valgrind's memcheck and report the errors
that involve the compiled core (pydflash._core, which links llama.cpp and
ggml statically): invalid reads/writes, uses of uninitialised values, bad
frees, and memory definitely lost. CPython's own noise (its allocator, its
interned objects at exit) is not ours and is filtered out by that rule.

    python tools/memcheck.py                 # ~5-10 minutes on 2 cores
    python tools/memcheck.py --json out.json

Exit status 0 when nothing involving the core is found. Not part of the test
suite: valgrind slows the process ~30-50x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

# The workload: every path a user drives, on a tiny pair, single-threaded so
# that valgrind's serialised threads do not dominate the time.
WORKLOAD = r"""
import sys, threading
from pathlib import Path
from pydflash import Llama, ModelLoadError, DraftCompatibilityError, gguf_writers
d = Path(sys.argv[1])
t = gguf_writers.TargetSpec(n_embd=32, n_layer=2, n_head=2, n_head_kv=1, head_dim=16, n_ff=64)
dr = gguf_writers.DrafterSpec(n_head=2, n_head_kv=1, head_dim=16, n_ff=64, target_layers=(0, 1), block_size=8)
gguf_writers.write_target(d / "t.gguf", t)
gguf_writers.write_drafter(d / "d.gguf", t, dr)
(d / "bad.gguf").write_bytes((d / "t.gguf").read_bytes()[:3000])
for bad in (d / "bad.gguf", d / "missing.gguf"):
    try:
        Llama(bad, n_ctx=64)
    except ModelLoadError:
        pass
try:
    Llama(d / "t.gguf", draft=d / "t.gguf", n_ctx=64)
except DraftCompatibilityError:
    pass
with Llama(d / "t.gguf", n_ctx=256, n_threads=1) as base, \
     Llama(d / "t.gguf", draft=d / "d.gguf", n_ctx=256, n_threads=1) as llm:
    ref = base.generate("def f(x):", max_tokens=24, ignore_eos=True).tokens
    assert llm.generate("def f(x):", max_tokens=24, ignore_eos=True).tokens == ref
    llm.generate("import os", max_tokens=16, temperature=0.8, seed=1, ignore_eos=True)
    llm.generate("import os", max_tokens=16, temperature=0.8, seed=1, ignore_eos=True, verify="match",
                 repeat_penalty=1.2, logit_bias={5: 2.0}, top_k=20, top_p=0.9, min_p=0.01)
    it = llm.stream("x = [", max_tokens=20, stop=["]"])
    next(it); it.close()
    pair = llm.pair
    pair.prefill([1, 2, 3, 4])
    pair.step(draft=[5, 6, 7])
    pair.step(draft_max=3)
    pair.score([1, 2, 3])
    try:
        pair.step(draft=[10**6])
    except ValueError:
        pass
    timer = threading.Timer(0.5, llm.interrupt)
    timer.start()
    try:
        llm.generate("y", max_tokens=200, ignore_eos=True)
    except Exception:
        pass
    timer.cancel()
    llm.generate("z", max_tokens=4, ignore_eos=True)
print("workload done", flush=True)
"""

SERIOUS = {"InvalidRead", "InvalidWrite", "InvalidFree", "MismatchedFree", "UninitCondition", "UninitValue",
           "SyscallParam", "Overlap", "InvalidMemPool", "FishyValue", "Leak_DefinitelyLost"}


def core_library() -> str:
    import pydflash._core as core
    return os.path.basename(core.__file__)


def errors_in_core(xml_path: Path, lib: str) -> tuple[list[dict], int]:
    """(errors whose stack passes through the core, number of errors in total)."""
    root = ET.parse(xml_path).getroot()
    found, total = [], 0
    for err in root.iter("error"):
        total += 1
        kind = err.findtext("kind", "")
        frames = [(f.findtext("obj", ""), f.findtext("fn", "?"), f.findtext("file", ""), f.findtext("line", ""))
                  for f in err.iter("frame")]
        if kind in SERIOUS and any(lib in obj for obj, *_ in frames):
            what = err.findtext("what") or err.findtext("xwhat/text") or ""
            found.append({"kind": kind, "what": what,
                          "stack": [f"{fn} ({file}:{line})" if file else f"{fn} [{os.path.basename(obj)}]"
                                    for obj, fn, file, line in frames[:12]]})
    return found, total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--keep", action="store_true", help="keep valgrind's XML output")
    args = ap.parse_args(argv)
    if shutil.which("valgrind") is None:
        ap.error("valgrind is not installed")
    lib = core_library()
    work = Path(tempfile.mkdtemp(prefix="pydflash-memcheck-"))
    xml_path = work / "memcheck.xml"
    env = dict(os.environ, PYTHONMALLOC="malloc", OMP_NUM_THREADS="1")
    cmd = ["valgrind", "--tool=memcheck", "--leak-check=full", "--show-leak-kinds=definite",
           "--errors-for-leak-kinds=definite", "--track-origins=no", "--num-callers=30",
           "--xml=yes", f"--xml-file={xml_path}", sys.executable, "-c", WORKLOAD, str(work)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if "workload done" not in proc.stdout:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        print("the workload did not finish under valgrind", file=sys.stderr)
        return 2
    found, total = errors_in_core(xml_path, lib)
    report = {"core_library": lib, "valgrind_errors_total": total, "errors_in_core": found}
    print(f"valgrind memcheck: {total} error records in total, {len(found)} involve {lib}")
    for e in found:
        print(f"- {e['kind']}: {e['what']}")
        for line in e["stack"]:
            print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.keep:
        print(f"XML kept at {xml_path}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
