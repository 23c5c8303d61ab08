"""Clients of a ``pydflash serve`` subprocess over HTTP: start one on a free port, GET,
POST JSON, read /metrics."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator


@contextlib.contextmanager
def serve(*args: str) -> Iterator[str]:
    """`pydflash serve ARGS` on a free port of 127.0.0.1; yields its URL."""
    # one compute thread unless the test says otherwise (tests/conftest.py: one_compute_thread)
    threads = [] if {"-t", "--threads"} & set(args) else ["--threads", "1"]
    cmd = [sys.executable, "-m", "pydflash", "serve", "--host", "127.0.0.1", "--port", "0", "--metrics", *threads]
    cmd += args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        out = proc.stderr.read()
        proc.stderr.close()
        raise AssertionError("server did not start:\n" + "".join(lines) + out)
    drain = threading.Thread(target=proc.stderr.read, daemon=True)  # never let the pipe fill up
    drain.start()
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            drain.join(timeout=30)
        proc.stderr.close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics(server: str) -> dict[str, float]:
    status, text = get(server + "/metrics")
    assert status == 200
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def post(server: str, body: dict, path: str = "/v1/completions") -> tuple[int, dict]:
    req = urllib.request.Request(
        server + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
