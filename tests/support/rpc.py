"""``pydflash rpc-server`` subprocesses on loopback ports (tests/test_rpc.py; its
subprocesses import this module too)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time


class RpcServer:
    """A `pydflash rpc-server` subprocess and its output so far (read by a thread)."""

    def __init__(self, port: int):
        self.port = port
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pydflash", "rpc-server", "--port", str(port), "--threads", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)
        self.proc.stdout.close()  # type: ignore[union-attr]
        return self.output


def closed_port() -> socket.socket:
    """A bound socket that does not listen: connecting to its port is refused,
    and no other process can take the port while the socket is open."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def start_server(attempts: int = 5) -> RpcServer:
    """An RPC server on a free port. The port is found by binding port 0 and
    released for the server, so another process may take it first: then the
    server cannot bind and exits, and we retry on another port. A connection
    counts as ours only when our server logs it."""
    for _ in range(attempts):
        with closed_port() as s:
            port = s.getsockname()[1]
        srv = RpcServer(port)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and srv.proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                time.sleep(0.05)
                continue
            while time.monotonic() < deadline and srv.proc.poll() is None:
                if "Accepted client connection" in srv.output:
                    return srv
                time.sleep(0.01)
        if srv.proc.poll() is None:
            srv.stop(signal.SIGKILL)
            raise AssertionError("rpc-server did not start listening:\n" + srv.output)
        srv.stop()
        if "Failed to create server socket" not in srv.output:
            raise AssertionError(f"rpc-server exited with {srv.proc.returncode}:\n{srv.output}")
    raise AssertionError(f"rpc-server found no free port in {attempts} attempts")
