"""Who may call the server: API keys, the ``Host`` header, CORS, and which bodies
are read as JSON. One ASGI middleware in front of every route.

- ``--api-key`` / ``--api-key-file``: every path but ``/health``, ``/v1/health`` and
  the chat page's files (as llama-server's UI) needs a key, in ``Authorization: Bearer
  KEY`` or ``x-api-key: KEY`` (Anthropic's header), as llama-server reads them; keys are
  compared in constant time; a wrong or missing key is llama-server's 401
  ``authentication_error``.
- A server that listens on loopback only answers requests whose ``Host`` is a
  loopback name: a web page that rebinds its own DNS name to 127.0.0.1 cannot reach it.
- A POST body from a page (a request with an ``Origin``) must be JSON
  (``application/json``): any other type, or none (a typeless ``Blob``), needs no CORS
  preflight, and a page must pass the preflight, which ``--cors-origins`` answers, before
  it can start a generation (415 otherwise). Without an ``Origin`` (curl, SDKs) a body
  with no type or a form type is read as JSON, as llama-server reads it; ``text/plain``
  and ``multipart/form-data`` are refused from anyone.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .http import error_response
from .webui import PATHS as WEBUI_PATHS

__all__ = ["PUBLIC_PATHS", "Guard", "loopback_only"]

PUBLIC_PATHS = frozenset({"/health", "/v1/health", *WEBUI_PATHS})  # llama-server's: no key needed
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_SIMPLE_TYPES = frozenset({"text/plain", "multipart/form-data"})


def loopback_only(hosts: Iterable[str]) -> bool:
    """Whether every address in ``hosts`` is a loopback one."""
    for host in hosts:
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host.strip("[]")).is_loopback:
                return False
        except ValueError:
            return False
    return True


def _host_name(host: str) -> str:
    """``Host`` without its port: ``[::1]:8080`` -> ``::1``, ``a:80`` -> ``a``."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """``api_keys``: empty for none. ``cors_origins``: ``*`` (any, llama-server's
    default), ``localhost`` (loopback origins only) or a comma-separated list.
    ``check_host``: refuse a ``Host`` that is not a loopback name."""

    def __init__(self, app: ASGIApp, api_keys: Sequence[str], cors_origins: str, check_host: bool) -> None:
        self.app = app
        self.keys = [k.encode() for k in api_keys]
        self.origins = {o.strip() for o in cors_origins.split(",") if o.strip()}
        self.check_host = check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        allow = self._allowed_origin(origin)
        refusal = self._refusal(scope, headers, origin, allow)
        send = _with_cors(send, allow)
        if refusal is not None:
            await refusal(scope, receive, send)
        elif scope["method"] == "OPTIONS":  # the preflight: browsers send no key with it
            preflight = {  # llama-server's answer
                "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": "*",
                "Access-Control-Allow-Credentials": "true",
            }
            await Response(b"", 200, preflight, "text/html")(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _allowed_origin(self, origin: str | None) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for a request from ``origin``
        (``*``: the origin echoed, as llama-server does; no Origin: none needed)."""
        if origin is None:
            return "*" if "*" in self.origins else None
        if "*" in self.origins:
            return origin
        if "localhost" in self.origins and _is_local_origin(origin):
            return origin
        return origin if origin in self.origins else None

    def _refusal(self, scope: Scope, headers: Headers, origin: str | None, allow: str | None) -> Response | None:
        if self.check_host and _host_name(headers.get("host", "").lower()) not in _LOOPBACK_NAMES:
            return error_response(403, "the Host header must name this server (localhost or a loopback address)")
        if scope["method"] == "OPTIONS":
            return None  # a preflight from an origin not allowed: answered without its header
        if origin is not None and allow is None:
            return error_response(403, f"origin {origin!r} is not allowed (see --cors-origins)")
        if self.keys and scope["path"] not in PUBLIC_PATHS and not self._key_ok(headers):
            return error_response(401, "Invalid API Key")
        if scope["method"] == "POST" and _has_body(headers):
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            json_type = kind == "application/json" or kind.endswith("+json")
            # from a page (an Origin): JSON only, so that it needs the preflight; a tool's
            # body with no type or curl -d's form type is still read as JSON
            if kind in _SIMPLE_TYPES or (origin is not None and not json_type):
                return error_response(
                    415, f"the request body must be JSON (Content-Type: application/json), not {kind or 'untyped'}"
                )
        return None

    def _key_ok(self, headers: Headers) -> bool:
        header = headers.get("authorization") or headers.get("x-api-key") or ""
        given = header.removeprefix("Bearer ").encode()
        ok = False
        for key in self.keys:  # every key compared, in constant time each
            ok |= hmac.compare_digest(given, key)
        return ok


def _has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers


def _is_local_origin(origin: str) -> bool:
    host = origin.split("://", 1)[-1]
    return _host_name(host.split("/", 1)[0].lower()) in _LOOPBACK_NAMES


def _with_cors(send: Send, allow: str | None) -> Send:
    if allow is None:
        return send

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {
                **message,
                "headers": [*message.get("headers", []), (b"access-control-allow-origin", allow.encode())],
            }
        await send(message)

    return sender
