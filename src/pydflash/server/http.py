"""The server's HTTP layer below the routes: uvicorn's HTTP/1.1 protocol (h11)
with the changes a model server needs, a check of the request's framing, and
OpenAI-style error responses."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Mapping
from typing import Any

import anyio
import h11
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "CanonicalHeaders",
    "FramingCheck",
    "HTTPProtocol",
    "error_response",
    "json_response",
    "protocol",
    "read_body",
]

_PEER_POLL_S = 0.05
# the kernel's send buffer per connection (Linux doubles it): small, so that a client
# that stops reading is found within a few chunks (autotuned, it grows to 4 MB, which
# a stream may never fill) and a thousand open connections cost no gigabytes
_SEND_BUFFER = 64 * 1024

# llama-server's error types (server-common.cpp, format_error_response)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
# an absolute path (POSIX or Windows) in a message: only its last part is shown, so
# that errors do not tell a client where the server keeps its files
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/\\])(?:/|[A-Za-z]:\\)(?:[^\s'\"/\\]+[/\\])+(?=[^\s'\"/\\])")


def scrub(message: str) -> str:
    """``message`` with each absolute path cut to its file name."""
    return _ABSOLUTE_PATH.sub("", message)


def error_body(
    status: int, message: str, param: str | None = None, kind: str | None = None, **extra: Any
) -> dict[str, Any]:
    """llama-server's error object (OpenAI's, with ``code`` the HTTP status); ``kind``:
    its ``type`` where the status does not say it (``exceed_context_size_error``)."""
    kind = kind or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": scrub(message), "type": kind, "param": param, "code": status, **extra}}


def error_response(
    status: int, message: str, param: str | None = None, headers: Mapping[str, str] | None = None, **extra: Any
) -> Response:
    return Response(json.dumps(error_body(status, message, param, **extra)), status, headers, "application/json")


def protocol(write_timeout: float, max_connections: int | None) -> type[HTTPProtocol]:
    """The protocol class of one server: its write timeout and connection cap."""
    return type("HTTPProtocol", (HTTPProtocol,), {"write_timeout": write_timeout, "max_connections": max_connections})


async def _over_capacity(scope: Scope, receive: Receive, send: Send) -> None:
    msg = "the server has too many open connections; retry later"
    await error_response(503, msg, headers={"Retry-After": "1", "Connection": "close"})(scope, receive, send)


class HTTPProtocol(H11Protocol):
    """uvicorn's h11 protocol, changed in these ways:

    - the idle timer (``timeout_keep_alive``) also runs from the connection's start
      and over a request head that arrives slowly: a client that sends nothing, or
      its headers a byte at a time, is closed (uvicorn arms it after a response only);
    - a client that half-closes after a complete request (``shutdown(SHUT_WR)``, as
      ``nc -N`` does) still gets its response. A closed socket and a half-closed one
      both read as EOF; an interim ``100 Continue`` (clients skip 1xx responses) tells
      them apart, as a closed socket answers it with a reset, which disconnects the
      request (its generation is cancelled). HTTP/1.0 has no interim responses: such a
      client is answered without the probe;
    - a client that reads nothing for ``write_timeout`` seconds while a response waits
      to be written is cut off (its request sees a disconnect, its generation ends):
      uvicorn would wait for it forever, holding its admission;
    - past ``max_connections`` open connections, the 503 is a JSON error object (uvicorn's is
      plain text), as is its 400 for a malformed request."""

    write_timeout: float = 60.0
    max_connections: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # the cap is ours (below): uvicorn's 503 is plain text
        app = self.app

        async def capped(scope: Scope, receive: Receive, send: Send) -> None:
            cap = self.max_connections
            if cap is not None and (len(self.connections) > cap or len(self.tasks) > cap):
                await _over_capacity(scope, receive, send)
            else:
                await app(scope, receive, send)

        self.app = capped
        self._write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]  # uvicorn types it as Transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_write_timer()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self.transport.abort)

    def resume_writing(self) -> None:
        self._stop_write_timer()
        super().resume_writing()

    def _stop_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def data_received(self, data: bytes) -> None:
        timer, cycle = self.timeout_keep_alive_task, self.cycle
        self.timeout_keep_alive_task = None  # uvicorn cancels the timer on any byte
        super().data_received(data)
        if timer is None:
            return
        if self.cycle is cycle and self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = timer  # no complete request head yet: the clock runs on
        else:
            timer.cancel()

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's signature; uvicorn's says None
        cycle = self.cycle
        if cycle is None or cycle.response_complete or cycle.more_body:
            return None  # between requests or inside a body: nothing more can come, close
        cycle.keep_alive = False  # answer, then close
        if not cycle.response_started and self.scope.get("http_version") != "1.0":
            probe = h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")
            self.transport.write(self.conn.send(probe))
            self._watch_peer()
        return True  # keep the transport open for writing

    def _watch_peer(self) -> None:
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_complete:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.transport.abort()  # reset by the peer: uvicorn marks the request disconnected
            return
        self.loop.call_later(_PEER_POLL_S, self._watch_peer)

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(400, msg)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


class FramingCheck:
    """Refuses (400, then closes) a request with both ``Transfer-Encoding`` and
    ``Content-Length``: h11 follows the first, as RFC 9112 says, but a proxy in
    front may have followed the second, and that disagreement is how requests
    are smuggled onto a kept-alive connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name for name, _ in scope["headers"]}
            if b"transfer-encoding" in names and b"content-length" in names:
                msg = "a request may not have both Transfer-Encoding and Content-Length"
                await error_response(400, msg, headers={"Connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


class CanonicalHeaders:
    """Response header names in their canonical case (``Content-Type``,
    ``Access-Control-Allow-Origin``), as llama-server writes them: header names are
    case-insensitive, but some clients look them up in a plain dict. Also adds
    llama-server's ``Process-Start-Time-Unix`` to every response."""

    def __init__(self, app: ASGIApp, start_time: int) -> None:
        self.app = app
        self.start = (b"Process-Start-Time-Unix", str(start_time).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sender(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = [(b"-".join(w.capitalize() for w in k.split(b"-")), v) for k, v in message.get("headers", [])]
                message = {**message, "headers": [*names, self.start]}
            await send(message)

        await self.app(scope, receive, sender)


def json_response(obj: Any, status: int = 200) -> Response:
    # json.dumps as it is: a logprob may be -Infinity, which Starlette's JSONResponse refuses
    return Response(json.dumps(obj), status, media_type="application/json")


async def read_body(request: Request, limit: int, timeout: float) -> bytes | Response:
    """A request's whole body, or the error response when it is over ``limit`` bytes
    (413) or does not arrive within ``timeout`` seconds (408); both close the connection."""
    declared = request.headers.get("content-length", "0")
    too_big = error_response(413, f"request body is over {limit} bytes", headers={"Connection": "close"})
    if declared.isdigit() and int(declared) > limit:
        return too_big
    body = bytearray()
    try:
        with anyio.fail_after(timeout):
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    return too_big
    except TimeoutError:
        msg = f"the request body did not arrive within {timeout:g} s"
        return error_response(408, msg, headers={"Connection": "close"})
    return bytes(body)


async def read_json_object(
    request: Request, limit: int, timeout: float, empty_ok: bool = False
) -> dict[str, Any] | Response:
    """A request's body as a JSON object (``empty_ok``: no body reads as ``{}``), or the
    error response: read_body's, or a 400 for JSON that does not parse or is no object."""
    raw = await read_body(request, limit, timeout)
    if isinstance(raw, Response):
        return raw
    try:
        body = json.loads(b"{}" if empty_ok and not raw else raw)
    except ValueError as e:
        return error_response(400, f"request body is not valid JSON: {e}")
    if not isinstance(body, dict):
        return error_response(400, "request body must be a JSON object")
    return body
