"""Raw HTTP/1.1 to an in-process ``pydflash.server.app.Server`` over real sockets (bytes
out as given, responses parsed one at a time), request bodies, SSE events, and polls of
its /metrics."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request
from collections.abc import Iterator

from pydflash.server.app import Server


class Conn:
    """A raw HTTP/1.1 connection: bytes out as given, responses parsed one at a time."""

    def __init__(self, srv: Server, timeout: float = 120):
        self.sock = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
        self.f = self.sock.makefile("rb")

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> None:
        length = f"Content-Length: {len(body)}\r\n" if method == "POST" else ""
        self.send(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{length}{headers}\r\n".encode() + body)

    def head(self) -> tuple[int, dict[str, str]]:
        """The next final response's status and headers (1xx responses skipped)."""
        status, headers = 100, {}
        while status < 200:
            line = self.f.readline()
            if not line:
                raise EOFError("the server closed the connection")
            status, headers = int(line.split()[1]), {}
            while (h := self.f.readline()) not in (b"\r\n", b""):
                k, v = h.decode().split(":", 1)
                headers[k.strip().lower()] = v.strip()
        return status, headers

    def chunks(self) -> Iterator[bytes]:
        """A chunked body's chunks, to its end (the zero-size chunk)."""
        while size := int(self.f.readline().split(b";")[0], 16):
            yield self.f.read(size)
            self.f.readline()
        self.f.readline()

    def response(self) -> tuple[int, dict[str, str], bytes]:
        """The next final response: status, headers, body."""
        status, headers = self.head()
        if "content-length" in headers:
            return status, headers, self.f.read(int(headers["content-length"]))
        if headers.get("transfer-encoding") == "chunked":
            return status, headers, b"".join(self.chunks())
        return status, headers, self.f.read()  # until the server closes

    def closed(self, within: float) -> bool:
        """Whether the server closes the connection within ``within`` seconds."""
        self.sock.settimeout(within)
        try:
            return self.f.read(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def reset(self) -> None:
        """Leave with a TCP reset (SO_LINGER 0), as a killed client does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.f.close()
        self.sock.close()


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def completion(**fields: object) -> bytes:
    return body(**{"prompt": "def f():", "max_tokens": 4, "temperature": 0, "ignore_eos": True, **fields})


def metrics(srv: Server) -> dict[str, float]:
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line[:1] not in "#")}


def generations(srv: Server) -> float:
    return metrics(srv)["pydflash_tokens_predicted_total"]


def poll(srv: Server, what: str, until, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(srv)
        if until(m):
            return m
        time.sleep(0.02)
    raise AssertionError(f"{what}: {metrics(srv)}")


def idle(srv: Server) -> dict[str, float]:
    return poll(
        srv,
        "requests still running",
        lambda m: m["pydflash_requests_processing"] == 0 and m["pydflash_requests_deferred"] == 0,
    )


def events(raw: bytes) -> list[dict | str]:
    out: list[dict | str] = []
    for block in raw.decode().split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out
