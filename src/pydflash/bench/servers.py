"""The HTTP servers the serving bench compares, each started as a child
process on 127.0.0.1: ``pydflash serve`` and llama.cpp's ``llama-server``
(built from the vendored tree), with DFlash and without speculation. Each runs in its own process group, so that
stopping it stops everything it started, with its output in a log file."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .engines import EngineUnavailable

PYDFLASH = "pydflash-serve"
LLAMA_SERVER = "llama-server"  # with DFlash
LLAMA_SERVER_PLAIN = "llama-server-plain"  # the same binary without a drafter: no speculation
LLAMA_ENGINES = (LLAMA_SERVER, LLAMA_SERVER_PLAIN)
ENGINES = (PYDFLASH, *LLAMA_ENGINES)

READY_TIMEOUT_S = 600.0  # loading a large model from a cold disk
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A port nothing listens on now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@functools.cache
def pydflash_serve_has_parallel() -> bool:
    """Whether this pydflash's ``serve`` takes ``--parallel`` (asked of its --help)."""
    out = subprocess.run(
        [sys.executable, "-m", "pydflash", "serve", "--help"], capture_output=True, text=True, timeout=120
    )
    return "--parallel" in out.stdout


def pydflash_command(settings: dict[str, Any], port: int, slots: int) -> list[str]:
    """``pydflash serve`` with ``slots`` parallel requests where it supports
    them (else one generation at a time, requests queued: one slot's context).
    Its draft length is its own adaptive choice unless the bench pins one."""
    parallel = pydflash_serve_has_parallel()
    cmd = [
        sys.executable,
        "-m",
        "pydflash",
        "serve",
        "-m",
        settings["target"],
        "-d",
        settings["draft"],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n-ctx",
        str(settings["n_ctx_per_slot"] * (slots if parallel else 1)),
        "--threads",
        str(settings["threads"]),
        "-fa",
        settings["flash_attn"],
    ]
    if settings.get("pin_draft"):  # else its own adaptive length, up to the same maximum (the drafter's block)
        cmd += ["--draft-max", str(settings["draft_max"])]
    if parallel:
        cmd += ["--parallel", str(slots)]
    return cmd


def llama_server_command(settings: dict[str, Any], port: int, slots: int) -> list[str]:
    """llama-server with DFlash, its draft options as llama-speculative-simple
    gets them in the single-request bench; -c is split over the -np slots."""
    draft = [
        "-md", settings["draft"], "--spec-type", "draft-dflash", "--spec-draft-n-max", str(settings["draft_max"]),
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-ngld", "0",
    ]  # fmt: skip
    cmd = llama_server_plain_command(settings, port, slots)
    return [*cmd[:3], *draft, *cmd[3:]]


def llama_server_plain_command(settings: dict[str, Any], port: int, slots: int) -> list[str]:
    """llama-server without speculation (no drafter, no --spec-* options) and
    otherwise as llama_server_command's. Batch sizes are pydflash's (512), so
    that llama-server's prefill comes in chunks of the same size as pydflash's."""
    exe = settings["llama_server"]
    if exe is None or not os.access(exe, os.X_OK):
        raise EngineUnavailable(
            "llama-server not found (build it: python tools/build_native.py, or pass --llama-server PATH)"
        )
    return [
        exe, "-m", settings["target"],
        "-np", str(slots), "-c", str(settings["n_ctx_per_slot"] * slots), "-b", "512", "-ub", "512",
        "-t", str(settings["threads"]), "-ngl", "0", "-fa", settings["flash_attn"],
        "--host", "127.0.0.1", "--port", str(port), "--no-webui",
    ]  # fmt: skip


COMMANDS = {
    PYDFLASH: pydflash_command,
    LLAMA_SERVER: llama_server_command,
    LLAMA_SERVER_PLAIN: llama_server_plain_command,
}


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises SystemExit inside the block, so that the finally clauses
    that stop the servers run (Python's default would end the process at once
    and leave them running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(*_: object) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ServerProcess:
    """One server, started and ready (``/health`` answers 200); ``stop()`` ends it."""

    def __init__(self, engine: str, settings: dict[str, Any], slots: int, log_path: Path):
        self.engine = engine
        self.log_path = log_path
        for _ in range(3):  # another process may take the free port first
            port = free_port()
            self.command = COMMANDS[engine](settings, port, slots)
            self.url = f"http://127.0.0.1:{port}"
            self._log: IO[str] = log_path.open("a", encoding="utf-8")
            self._log.write(f"\n$ {shlex.join(self.command)}\n")
            self._log.flush()
            self._log_start = self._log.tell()  # this start's output begins here
            self.proc = subprocess.Popen(
                self.command, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stop() reaches its children too
            )  # fmt: skip
            try:
                self._wait_ready()
                return
            except EngineUnavailable:
                self.stop()
                if not any(s in self.log_tail() for s in ("in use", "bind")):
                    raise
        raise EngineUnavailable(f"{engine}: no free port after 3 tries (see {log_path})")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise EngineUnavailable(f"{self.engine} exited ({rc}) while starting: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or 503 while llama-server loads
            time.sleep(0.2)
        raise EngineUnavailable(f"{self.engine} not ready after {READY_TIMEOUT_S:.0f} s (see {self.log_path})")

    def log_tail(self, n: int = 1500) -> str:
        """The end of this start's output."""
        with self.log_path.open(encoding="utf-8", errors="replace") as f:
            f.seek(self._log_start)
            text = f.read()
        return f"...{text[-n:].strip()} (log: {self.log_path})"

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL if it lingers."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, None)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def info(self) -> dict[str, Any]:
        """What the server says about itself (GET /v1/models), for the JSON."""
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as r:
                data: dict[str, Any] = json.load(r)
                return data
        except (urllib.error.URLError, OSError, ValueError) as e:
            return {"error": str(e)}
