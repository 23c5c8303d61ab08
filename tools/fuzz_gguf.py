#!/usr/bin/env python3
"""Fuzz pydflash's GGUF load path with atheris (libFuzzer's mutation engine).

Every input is written to a file and loaded by a long-lived worker process,
once as a target (``Llama(path)``) and once as a drafter beside a good target
(``Llama(good, draft=path)``). The only acceptable outcomes are a clean load or
``ModelLoadError`` / ``DraftCompatibilityError``. A worker that dies (signal,
abort), hangs, or raises anything else is a finding: the input is saved under
``--findings`` and the worker restarted, so one run reports every finding.

Inputs: libFuzzer mutations of valid files only — a tiny qwen3 target and its DFlash drafter written
with pydflash.gguf_writers, and tests/data/good-tiny.gguf (the crafted bad corpus is
already covered by tests/test_malformed_gguf.py; mutating valid files reaches
deeper into the loader). The C++ core is not built with libFuzzer
instrumentation, so libFuzzer gets no native coverage and keeps mutating the
seeds (stacked byte, integer and splice mutations): a mutational fuzzer over
real file structure, not a coverage-guided one.

    python tools/fuzz_gguf.py --runs 1500           # bounded (tests/test_fuzz_gguf.py)
    python tools/fuzz_gguf.py --seconds 1800        # a long run
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER_BYTES = 16 * 1024
DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

WORKER = r"""
import sys
from pydflash import Llama, ModelLoadError, DraftCompatibilityError
good = sys.argv[1]
for line in sys.stdin:
    path = line.strip()
    out = []
    for role in ("target", "drafter"):
        try:
            if role == "target":
                Llama(path, n_ctx=64).close()
            else:
                Llama(good, draft=path, n_ctx=64).close()
            out.append("loaded")
        except (ModelLoadError, DraftCompatibilityError):
            out.append("refused")
        except BaseException as e:  # anything else is a finding, reported by name
            out.append("unexpected:" + type(e).__name__ + ":" + str(e).replace("\n", " ")[:200])
    print(" ".join(out), flush=True)
"""


class Worker:
    """One child process that loads files; restarted after it dies or hangs."""

    def __init__(self, good: Path, timeout: float):
        self.good, self.timeout = good, timeout
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(self.good)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, bufsize=1)
        return self.proc

    def load(self, path: str) -> str:
        proc = self._start()
        try:
            proc.stdin.write(path + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died(proc)
        ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
        if not ready:
            proc.kill()
            proc.wait()
            return f"hang (> {self.timeout:.0f} s)"
        line = proc.stdout.readline()
        return line.strip() if line else self._died(proc)

    @staticmethod
    def _died(proc: subprocess.Popen) -> str:
        rc = proc.wait()
        return f"crash (exit {rc})"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def write_seeds(seeds: Path) -> Path:
    """Valid seed files; returns the target that mutated drafters are paired with."""
    from pydflash import gguf_writers

    target = gguf_writers.TargetSpec(n_embd=16, n_layer=2, n_head=2, n_head_kv=1, head_dim=8, n_ff=32, n_vocab=300)
    drafter = gguf_writers.DrafterSpec(n_head=2, n_head_kv=1, head_dim=8, n_ff=32, target_layers=(0, 1), block_size=4)
    gguf_writers.write_target(seeds / "target.gguf", target)
    gguf_writers.write_drafter(seeds / "drafter.gguf", target, drafter)
    (seeds / "good-tiny.gguf").write_bytes((DATA / "good-tiny.gguf").read_bytes())
    good = seeds.parent / "good-target.gguf"  # outside the corpus folder libFuzzer writes to
    good.write_bytes((seeds / "target.gguf").read_bytes())
    return good


def is_finding(outcome: str) -> bool:
    return any(w not in ("loaded", "refused") for w in outcome.split(" "))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=0, help="stop after this many inputs (0: no limit)")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed (reproducible runs)")
    ap.add_argument("--max-len", type=int, default=96 * 1024, help="largest input in bytes")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds before a load counts as a hang")
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"), help="where failing inputs go")
    ap.add_argument("--json", type=Path, help="write the summary here as JSON")
    args = ap.parse_args(argv)
    if args.runs <= 0 and args.seconds <= 0:
        ap.error("give --runs and/or --seconds")

    import atheris  # imported here so that --help works without it

    work = Path(tempfile.mkdtemp(prefix="pydflash-fuzz-"))
    seeds = work / "seeds"  # libFuzzer adds to its corpus folder: never point it at tests/data
    seeds.mkdir()
    target = write_seeds(seeds)
    case = work / "case.gguf"
    worker = Worker(target, args.timeout)
    stats = {"runs": 0, "loaded_as_target": 0, "loaded_as_drafter": 0, "refused_both": 0, "findings": []}
    t_start = time.monotonic()

    def finish() -> None:
        worker.close()
        stats["seconds"] = round(time.monotonic() - t_start, 1)
        stats["runs_per_second"] = round(stats["runs"] / max(stats["seconds"], 1e-9), 1)
        print("\nfuzz summary: " + json.dumps({k: v for k, v in stats.items() if k != "findings"}), flush=True)
        for f in stats["findings"]:
            print(f"FINDING {f['outcome']}: {f['file']}", flush=True)
        if args.json:
            args.json.write_text(json.dumps(stats, indent=2) + "\n")
        sys.stdout.flush()
        os._exit(1 if stats["findings"] else 0)  # libFuzzer's own exit path skips Python's cleanup

    def one_input(data: bytes) -> None:
        case.write_bytes(data)
        outcome = worker.load(str(case))
        stats["runs"] += 1
        if is_finding(outcome):
            args.findings.mkdir(parents=True, exist_ok=True)
            dest = args.findings / (hashlib.sha1(data).hexdigest()[:16] + ".gguf")
            dest.write_bytes(data)
            stats["findings"].append({"outcome": outcome, "file": str(dest)})
            print(f"FINDING {outcome}: saved {dest}", flush=True)
        else:
            roles = outcome.split(" ")
            stats["loaded_as_target"] += roles[0] == "loaded"
            stats["loaded_as_drafter"] += roles[1] == "loaded"
            stats["refused_both"] += roles == ["refused", "refused"]
        if (args.runs and stats["runs"] >= args.runs) or \
           (args.seconds and time.monotonic() - t_start >= args.seconds):
            finish()

    bases = [p.read_bytes() for p in sorted(seeds.iterdir())]
    weights = [2 if p.name == "drafter.gguf" else 1 for p in sorted(seeds.iterdir())]

    def mutate(data: bytes, max_size: int, seed: int) -> bytes:
        # Start from a seed file chosen here, not from libFuzzer's pick: with no
        # native coverage its schedule would favour one file. Most of a model
        # file is tensor data, where a changed byte changes a weight and nothing
        # else; aim 4 in 5 inputs at the first 16 KiB (header, key-value pairs,
        # tensor infos) and stack 1-4 libFuzzer mutations there.
        rng = random.Random(seed)
        base = rng.choices(bases, weights)[0]
        head = HEADER_BYTES if rng.random() < 0.8 else len(base)
        prefix = base[:head]
        for _ in range(rng.randint(1, 4)):
            prefix = atheris.Mutate(prefix, max(1, min(max_size - (len(base) - head), head + 256)))
        return (prefix + base[head:])[:max_size]

    # keep_seed: without native coverage libFuzzer would otherwise drop the
    # seeds and mutate from an empty input
    atheris.Setup([sys.argv[0], f"-seed={args.seed}", f"-max_len={args.max_len}", "-keep_seed=1",
                   "-print_final_stats=0", str(seeds)], one_input, custom_mutator=mutate)
    atheris.Fuzz()
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
