"""The engines `pydflash bench` compares, seen from the parent process. Each
``run`` returns one measurement as a dict with the same keys: isl,
n_generated, prefill_s, decode_s, ttft_s, n_steps, n_drafted, n_accepted,
rss_peak_bytes (and tokens_head where the engine exposes tokens)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol

Measurement = dict[str, Any]  # one run's figures (the keys above); JSON values


class Engine(Protocol):
    """What the bench needs from an engine."""

    name: str
    uses_draft: bool
    info: dict[str, Any]
    persistent: bool  # its state (threads, caches) outlives a run: the bench times it warm

    def run(self, text: str, osl: int, draft_max: int | None) -> Measurement: ...

    def close(self) -> None: ...


class EngineUnavailable(Exception):
    """The engine cannot run here (not installed, not built); the bench skips it."""


class WorkerEngine:
    """An engine in a long-lived child process (pydflash.bench.worker)."""

    persistent = True  # its state (threads, caches) outlives a run: the bench times it warm

    def __init__(
        self,
        name: str,
        kind: str,
        target: str,
        draft: str | None,
        n_ctx: int,
        threads: int,
        n_batch: int,
        flash_attn: str,
        spec_type: str | None = None,
        draft_window: int | None = None,
    ):
        self.name = name
        self.uses_draft = draft is not None or spec_type is not None
        cmd = [
            sys.executable,
            "-m",
            "pydflash.bench.worker",
            "--engine",
            kind,
            "--target",
            target,
            "--n-ctx",
            str(n_ctx),
            "--threads",
            str(threads),
            "--n-batch",
            str(n_batch),
            "--flash-attn",
            flash_attn,
        ]
        if draft:
            cmd += ["--draft", draft]
        if spec_type:
            cmd += ["--spec-type", spec_type]
        if draft_window is not None:
            cmd += ["--draft-window", str(draft_window)]
        # a pipe nobody reads could fill up and block; the file lives as long as the engine (close())
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1
        )
        hello = self._read()
        if "error" in hello:
            self.close()
            raise EngineUnavailable(hello["error"])
        self.info: dict[str, Any] = hello

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self._stderr.seek(0)
            err = self._stderr.read()
            raise EngineUnavailable(f"{self.name} worker exited: {err.strip()[-500:]}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, text: str, osl: int, draft_max: int | None) -> Measurement:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"text": text, "osl": osl, "draft_max": draft_max}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"{self.name}: {reply['error']}")
        return reply

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, OSError):
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()


_NATIVE_PATTERNS = {
    "encoded": re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "decoded": re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds"),
    "n_drafted": re.compile(r"n_drafted\s*=\s*(\d+)"),
    "n_accept": re.compile(r"n_accept\s*=\s*(\d+)"),
}


def find_binary(name: str, explicit: str | None) -> str | None:
    """A llama.cpp tool built from the vendored tree: ``explicit``, else
    build/native/bin in the current checkout (tools/build_native.py), else on PATH."""
    if explicit:
        return explicit
    local = Path.cwd() / "build" / "native" / "bin" / name
    if local.is_file():
        return str(local)
    return shutil.which(name)


def find_native(explicit: str | None) -> str | None:
    """llama-speculative-simple (see find_binary)."""
    return find_binary("llama-speculative-simple", explicit)


def find_llama_server(explicit: str | None) -> str | None:
    """llama-server (see find_binary)."""
    return find_binary("llama-server", explicit)


class NativeEngine:
    """llama.cpp's own DFlash loop: one llama-speculative-simple process per run
    (it loads the models each time; the figures are its own timings, which
    exclude loading)."""

    persistent = False  # a new process each run: nothing to keep warm

    def __init__(
        self,
        exe: str | None,
        target: str,
        draft: str | None,
        n_ctx: int,
        threads: int,
        flash_attn: str = "auto",
        spec_type: str = "draft-dflash",
        name: str = "llama.cpp-dflash",
    ):
        if exe is None or not os.access(exe, os.X_OK):
            raise EngineUnavailable(
                "llama-speculative-simple not found (build it: python tools/build_native.py, or pass --native PATH)"
            )
        self.name = name
        self.uses_draft = True
        self.exe, self.target, self.draft, self.n_ctx, self.threads = exe, target, draft, n_ctx, threads
        self.spec_type = spec_type
        self.flash_attn = flash_attn
        self.info: dict[str, Any] = {"exe": exe}
        self._dir = tempfile.TemporaryDirectory(prefix="pydflash-bench-native-")

    def run(self, text: str, osl: int, draft_max: int | None) -> Measurement:
        prompt = Path(self._dir.name) / "prompt.txt"
        prompt.write_text(text, encoding="utf-8")
        cmd = [
            self.exe,
            "-m",
            self.target,
            *(["-md", self.draft, "-ngld", "0"] if self.draft else []),
            "--spec-type",
            self.spec_type,
            "--spec-draft-n-max",
            str(draft_max),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            "0",
            "-f",
            str(prompt),
            "-n",
            str(osl),
            "-c",
            str(self.n_ctx),
            "-b",
            str(self.n_ctx),  # its prompt must fit one batch
            "-ub",
            "512",
            "-t",
            str(self.threads),
            "--temp",
            "0",
            "--top-k",
            "1",
            "--seed",
            "0",
            "--ignore-eos",
            "--no-escape",
            "-ngl",
            "0",
            "-fa",
            self.flash_attn,
        ]
        # Its logger is asynchronous and never flushed at exit (upstream issue
        # 22142): under load the final figures can be lost. tools/build_native.py
        # links in a flush at exit; a binary built otherwise is rerun then, and
        # the count of such reruns is reported.
        for _ in range(self.ATTEMPTS):
            out, rss = self._once(cmd)
            try:
                m = parse_native_output(out)
            except RuntimeError:
                self.info["reruns_lost_output"] = self.info.get("reruns_lost_output", 0) + 1
                continue
            m["rss_peak_bytes"] = rss
            return m
        raise RuntimeError(f"llama-speculative-simple's figures were lost {self.ATTEMPTS} times: {out[-800:]}")

    ATTEMPTS = 4

    @staticmethod
    def _once(cmd: list[str]) -> tuple[str, int]:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        # reap it ourselves: wait4 gives this child's own peak RSS
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        if rc != 0:
            raise RuntimeError(f"llama-speculative-simple failed ({rc}): {out.strip()[-800:]}")
        return out, rusage.ru_maxrss * 1024

    def close(self) -> None:
        self._dir.cleanup()


def parse_native_output(out: str) -> Measurement:
    """The figures llama-speculative-simple prints when it finishes."""
    found = {k: p.search(out) for k, p in _NATIVE_PATTERNS.items()}
    got = {k: m for k, m in found.items() if m is not None}
    missing = [k for k in found if k not in got]
    if missing:
        raise RuntimeError(f"could not read {missing} from llama-speculative-simple's output: {out[-800:]}")
    n = int(got["decoded"].group(1))
    prefill_s = float(got["encoded"].group(2))
    decode_s = float(got["decoded"].group(2))
    n_accept = int(got["n_accept"].group(1))
    steps = max(n - n_accept, 1)  # every target pass yields its accepted drafts + 1 token
    return {
        "isl": int(got["encoded"].group(1)),
        "n_generated": n,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "ttft_s": prefill_s + decode_s / steps,
        "n_steps": steps,
        "n_drafted": int(got["n_drafted"].group(1)),
        "n_accepted": n_accept,
    }
