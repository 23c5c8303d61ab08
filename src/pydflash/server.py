"""``pydflash serve``: an OpenAI-compatible HTTP server for one target + DFlash
drafter pair, on the standard library (``http.server``, SSE by hand).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus text, with DFlash's speculative counters). Requests are queued:
one generation runs at a time; a client that disconnects cancels its generation."""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .errors import ContextLimitError, GenerationInterrupted, PyDFlashError
from .llama import Llama
from .metrics import Metrics

__all__ = ["Server", "serve"]

log = logging.getLogger("pydflash.server")

MAX_BODY = 32 * 1024 * 1024
ROUTES = {
    "/health",
    "/v1/models",
    "/models",
    "/metrics",
    "/v1/completions",
    "/completions",
    "/v1/chat/completions",
    "/chat/completions",
}


class BadRequest(Exception):
    pass


class _Cancelled(Exception):
    pass


def _opt(body: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise BadRequest(f"'{name}' must be {kind.__name__}")
    return v


# llama-server samplers that do not give one distribution per position, which exact
# speculative sampling needs (mirostat's and adaptive-p's state follow each sample, XTC
# draws at random what to remove, DRY is not implemented): refused by name when on
# (field, the value from which it is on): llama-server's "off" values are 0 (-1 for adaptive-p)
_REFUSED_SAMPLERS: tuple[tuple[str, float], ...] = (
    ("mirostat", 1),
    ("xtc_probability", 1e-30),
    ("dry_multiplier", 1e-30),
    ("dynatemp_range", 1e-30),
    ("adaptive_target", 0),
)


def _sampling_args(body: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAI request fields pydflash understands (others are ignored)."""
    if _opt(body, "n", int, 1) != 1:
        raise BadRequest("only n=1 is supported")
    for name, on in _REFUSED_SAMPLERS:
        v = body.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= on:
            raise BadRequest(
                f"the '{name}' sampler is not supported (pydflash samples exactly under speculation; "
                "its samplers: top_k, typical_p, top_p, min_p, top_n_sigma, temperature, penalties)"
            )
    kw: dict[str, Any] = {}
    # structured output: OpenAI's response_format, llama-server's json_schema and grammar
    structured: tuple[tuple[str, type], ...] = (("response_format", dict), ("json_schema", dict), ("grammar", str))
    for name, kind in structured:
        if body.get(name) is not None:
            kw[name] = _opt(body, name, kind)
    for name, kind in (
        ("temperature", float),
        ("top_p", float),
        ("min_p", float),
        ("typical_p", float),
        ("top_n_sigma", float),
        ("top_k", int),
        ("frequency_penalty", float),
        ("presence_penalty", float),
        ("repeat_penalty", float),
        ("seed", int),
        ("ignore_eos", bool),
        ("draft_max", int),
        ("draft_min", int),
        ("draft_p_min", float),
        ("cache_prompt", bool),
        ("post_sampling_probs", bool),
    ):
        if body.get(name) is not None:
            kw[name] = _opt(body, name, kind)
    if _opt(body, "id_slot", int, -1) not in (-1, 0):  # llama-server's slot pin; one slot here
        raise BadRequest("'id_slot' must be -1 or 0 (this server has one slot)")
    stop = body.get("stop")
    if stop is not None:
        if not isinstance(stop, (str, list)) or (isinstance(stop, list) and not all(isinstance(s, str) for s in stop)):
            raise BadRequest("'stop' must be a string or a list of strings")
        kw["stop"] = stop
    if body.get("logit_bias") is not None:
        if not isinstance(body["logit_bias"], dict):
            raise BadRequest("'logit_bias' must be an object")
        kw["logit_bias"] = body["logit_bias"]
    return kw


class Server:
    """One model pair behind an HTTP server. ``start()`` serves in a thread
    (for tests and embedding); ``serve_forever()`` in the calling thread."""

    def __init__(self, llm: Llama, *, host: str = "127.0.0.1", port: int = 8080, alias: str | None = None):
        self.llm = llm
        self.alias = alias or llm.model_name
        self.metrics = Metrics(max_accepted=max(1, llm.pair.max_draft) if llm.has_draft else 1)
        self.queue = threading.Lock()  # one generation at a time per pair
        self.created = int(time.time())
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self.httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="pydflash-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- the generation queue --------------------------------------------------

    def run_exclusive(self, fn: Callable[[], Any], gone: Callable[[], bool]) -> Any:
        """Run ``fn`` when the pair is free (requests wait in turn). The
        generation itself polls ``gone()`` between steps and stops when the
        client has disconnected."""
        self.metrics.queue(deferred=1)
        try:
            self.queue.acquire()
        finally:
            self.metrics.queue(deferred=-1)
        self.metrics.queue(processing=1)
        try:
            if gone():
                raise _Cancelled()
            try:
                return fn()
            except GenerationInterrupted:
                if gone():
                    raise _Cancelled() from None
                raise
        finally:
            self.metrics.queue(processing=-1)
            self.queue.release()

    def model_card(self) -> dict[str, Any]:
        llm = self.llm
        meta = {
            "n_ctx": llm.n_ctx,
            "n_vocab": llm.n_vocab,
            "draft": llm.has_draft,
            "block_size": llm.pair.block_size if llm.has_draft else 0,
        }
        return {"id": self.alias, "object": "model", "created": self.created, "owned_by": "pydflash", "meta": meta}


class _Handler(BaseHTTPRequestHandler):
    """One request of ``srv`` (a subclass per server sets it: ``_handler``)."""

    srv: Server

    protocol_version = "HTTP/1.1"
    server_version = "pydflash"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    # -- plumbing ------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _client_gone(self) -> bool:
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            peek: bytes = self.connection.recv(1, socket.MSG_PEEK)
            return peek == b""
        except (OSError, ValueError):
            return True

    def _body(self) -> dict[str, Any]:
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("bad Content-Length") from None
        if n <= 0:
            raise BadRequest("request body is empty (expected JSON)")
        if n > MAX_BODY:
            raise BadRequest("request body is too large")
        try:
            body = json.loads(self.rfile.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadRequest(f"request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    # -- routes ----------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        self.srv.metrics.request(path if path in ROUTES else "other")
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [self.srv.model_card()]})
        elif path == "/metrics":
            self._send(200, self.srv.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route {self.path}", "not_found_error")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        self.srv.metrics.request(path if path in ROUTES else "other")
        if path in ("/v1/completions", "/completions"):
            make = self._completion
        elif path in ("/v1/chat/completions", "/chat/completions"):
            make = self._chat
        else:
            self._error(404, f"no route {self.path}", "not_found_error")
            return
        try:
            body = self._body()
            stream = bool(body.get("stream", False))
            kw = _sampling_args(body)
            call = make(body, kw)
            if stream:
                self.srv.run_exclusive(lambda: self._stream(call(True)), self._client_gone)
            else:
                res = self.srv.run_exclusive(lambda: call(False), self._client_gone)
                self.srv.metrics.generation(res["timings"])
                self._json(200, res)
        except _Cancelled:
            self.srv.metrics.add("requests_cancelled_total")
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.srv.metrics.add("requests_cancelled_total")
            self.close_connection = True
        except (BadRequest, ValueError, TypeError, ContextLimitError) as e:
            self.srv.metrics.add("requests_failed_total")
            self._error(400, str(e))
        except PyDFlashError as e:
            self.srv.metrics.add("requests_failed_total")
            self._error(500, str(e), "server_error")

    def _completion(self, body: dict[str, Any], kw: dict[str, Any]) -> Callable[[bool], Any]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise BadRequest("'prompt' must be a string, a list of token ids, or a list of one of these")
        if not isinstance(prompt, (str, list)):
            raise BadRequest("'prompt' is required (a string or a list of token ids)")
        if body.get("suffix"):
            raise BadRequest("'suffix' is not supported")
        kw["max_tokens"] = _opt(body, "max_tokens", int, 16)
        kw["echo"] = _opt(body, "echo", bool, False)
        # OpenAI's logprobs=N, or llama-server's n_probs=N
        n = _opt(body, "logprobs", int, _opt(body, "n_probs", int))
        if n is not None:
            kw["logprobs"] = n
        llm, alias = self.srv.llm, self.srv.alias
        return lambda stream: llm.create_completion(prompt, stream=stream, model=alias, cancel=self._client_gone, **kw)

    def _chat(self, body: dict[str, Any], kw: dict[str, Any]) -> Callable[[bool], Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool)):
            raise BadRequest("'max_tokens' must be int")
        kw["max_tokens"] = mt
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("'tools' must be a list")
        ctk = body.get("chat_template_kwargs")
        if ctk is not None and not isinstance(ctk, dict):
            raise BadRequest("'chat_template_kwargs' must be an object")
        if body.get("enable_thinking") is not None:
            kw["enable_thinking"] = _opt(body, "enable_thinking", bool)
        kw["logprobs"] = _opt(body, "logprobs", bool, False)
        kw["top_logprobs"] = _opt(body, "top_logprobs", int)
        # the template is applied here, before queueing, so a template error is a 400 at once
        llm, alias = self.srv.llm, self.srv.alias
        llm.apply_chat_template(messages, tools=tools, **(ctk or {}))
        return lambda stream: llm.create_chat_completion(
            messages, tools=tools, stream=stream, model=alias, chat_template_kwargs=ctk, cancel=self._client_gone, **kw
        )

    def _stream(self, chunks: Generator[dict[str, Any], None, None]) -> None:
        """Server-sent events; a failed write (client gone) closes the
        generator, which ends the generation at once."""
        try:
            first = next(chunks)  # errors before the first byte still get a JSON error response
        except StopIteration:
            first = None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            last = None
            for chunk in _chain(first, chunks):
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                last = chunk
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        finally:
            chunks.close()
        if last is not None and "timings" in last:
            self.srv.metrics.generation(last["timings"])


def _handler(srv: Server) -> type[_Handler]:
    return type("Handler", (_Handler,), {"srv": srv})


def _chain(first: dict[str, Any] | None, rest: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    if first is not None:
        yield first
    yield from rest


def serve(
    model: str,
    draft: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    alias: str | None = None,
    ready: Callable[[Server], None] | None = None,
    **llama_kwargs: Any,
) -> None:
    """Load the pair and serve until interrupted (Ctrl-C / SIGTERM)."""
    import signal

    with Llama(model, draft=draft, **llama_kwargs) as llm:
        srv = Server(llm, host=host, port=port, alias=alias)

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
        if ready is not None:
            ready(srv)
        try:
            srv.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            srv.httpd.server_close()
