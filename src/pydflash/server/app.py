"""``pydflash serve``: an OpenAI-compatible HTTP server for one target + DFlash
drafter pair, on Starlette and uvicorn (``pip install pydflash[server]``).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus, with DFlash's speculative counters). Each generation request runs
in one worker thread of its own, from parsing its body to its last chunk; the
model schedules the generations (``Llama(n_parallel=N)`` batches N of them), the
server does not serialise them. At most ``parallel + queue_size`` requests are
admitted at once (others: 503). A client that disconnects cancels its own
generation."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

try:
    import anyio
    import uvicorn
    from anyio.abc import ObjectReceiveStream, ObjectSendStream
    from pydantic import ValidationError
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send

    from .anthropic import AnthropicRequest
    from .http import CanonicalHeaders, FramingCheck, error_body, error_response, protocol
    from .limits import PromptLimit
    from .metrics import Metrics
    from .native import InfillRequest, NativeRequest
    from .requests import BadRequest, ChatRequest, CompletionRequest, Unsupported, describe
    from .responses import ResponsesRequest
    from .routes_native import model_file, native_routes
    from .security import Guard, loopback_only
except ImportError as e:  # the optional dependencies of the server extra
    raise ImportError(f"pydflash serve needs {e.name}: pip install pydflash[server]") from e

from ..errors import ContextLimitError, GenerationInterrupted, PyDFlashError
from ..llama import Llama

__all__ = ["MAX_BODY", "Server", "serve"]

log = logging.getLogger("pydflash.server")

MAX_BODY = 32 * 1024 * 1024
MAX_SLOT_BODY = 64 * 1024  # a slot action's body names a file: no more is needed
ROUTES = {
    "/health",
    "/v1/health",
    "/v1/metrics",
    "/v1/models",
    "/models",
    "/metrics",
    "/slots",
    "/v1/completions",
    "/completions",
    "/v1/chat/completions",
    "/chat/completions",
}
_Item = tuple[str, Any]  # what a worker hands to its request: ("result" | "head" | "chunk" | "error", payload)
_Kind = (
    type[CompletionRequest] | type[ChatRequest] | type[NativeRequest] | type[AnthropicRequest] | type[ResponsesRequest]
)
T = TypeVar("T")


class Server:
    """One model pair behind an HTTP server. ``start()`` serves from a thread (for
    tests and embedding) and returns once it listens; ``serve_forever()`` serves in
    the calling thread. ``port=0`` picks a free port (``.port`` is the real one).

    ``parallel``: the generations the model runs at once (its ``n_parallel``);
    ``queue_size``: admitted requests beyond those (default 4 x parallel, at least
    8); a request is admitted once its body has arrived. ``timeout``: seconds a client
    has to send its request body, and to read what the server writes (a client that
    reads nothing for that long is cut off and its generation ends);
    ``timeout_keep_alive``: an idle connection (or one whose request head is not
    complete) is closed after it; ``max_connections``: past it, 503.
    ``api_keys``: with any, every path but ``/health`` needs one; ``cors_origins``:
    ``*``, ``localhost`` or a comma-separated list; ``metrics``/``slots``: whether
    ``/metrics`` and ``/slots`` answer; ``shutdown_grace``: seconds running requests
    get to finish when the server stops, before streams end with an error event."""

    def __init__(
        self,
        llm: Llama,
        *,
        host: str | Sequence[str] = "127.0.0.1",
        port: int = 8080,
        alias: str | None = None,
        parallel: int | None = None,
        queue_size: int | None = None,
        timeout: float = 60.0,
        timeout_keep_alive: int = 5,
        max_connections: int = 256,
        slot_save_path: str | os.PathLike[str] | None = None,
        api_keys: Sequence[str] = (),
        cors_origins: str = "*",
        metrics: bool = True,
        slots: bool = True,
        shutdown_grace: float = 5.0,
        defaults: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
    ):
        parallel = llm.n_parallel if parallel is None else parallel
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if any(not k for k in api_keys):
            raise ValueError("an API key may not be empty")
        self.llm = llm
        # llama-server's --alias: a comma-separated list; the id is the first in order
        self.aliases = sorted({a.strip() for a in (alias or llm.model_name).split(",") if a.strip()})
        self.alias = self.aliases[0] if self.aliases else llm.model_name
        self.tags = sorted({t.strip() for t in tags if t.strip()})
        self.parallel = parallel
        self.queue_size = max(8, 4 * parallel) if queue_size is None else queue_size
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {self.queue_size}")
        self.timeout = timeout
        self.slot_save_path = None if slot_save_path is None else Path(slot_save_path)
        self.metrics = Metrics(max_accepted=max(1, llm.pair.max_draft) if llm.has_draft else 1, slots=parallel)
        self.metrics_on, self.slots_on = metrics, slots
        self.defaults = _clamped(dict(defaults or {}), llm)  # request fields' defaults (-n, --temp, ...)
        self.shutdown_grace = shutdown_grace
        self.limit = PromptLimit(llm)
        self.created = int(time.time())
        self.in_flight = 0  # admitted requests (read and written on the event loop only)
        self.draining = False  # the server is stopping: admit nothing more
        self.exchanges: set[_Exchange] = set()  # the admitted generation requests
        # each admitted request holds one thread: never wait for another request's
        self.threads = anyio.CapacityLimiter(self.parallel + self.queue_size)
        self.side_threads = anyio.CapacityLimiter(4)  # /slots, slot files, tokenizing: off the event loop
        hosts = [host] if isinstance(host, str) else list(host)
        if not hosts:
            raise ValueError("host: give at least one address")
        self._sockets: list[socket.socket] = []
        for h in hosts:  # port 0: the first address's free port, for all of them
            taken = self._sockets[0].getsockname()[1] if self._sockets else port
            family = socket.AF_INET6 if ":" in h else socket.AF_INET
            self._sockets.append(socket.create_server((h.strip("[]"), taken), family=family))
        app = self._app(api_keys, cors_origins, check_host=loopback_only(hosts))
        config = uvicorn.Config(
            app,
            http=protocol(write_timeout=timeout, max_connections=max_connections),
            ws="none",
            lifespan="off",
            loop="asyncio",
            log_config=None,  # the embedding program's logging, untouched
            server_header=False,  # ours names no versions
            headers=[("server", "pydflash")],
            timeout_keep_alive=timeout_keep_alive,
            timeout_graceful_shutdown=5,
        )
        self._uvicorn = _Uvicorn(config, self)
        self._thread: threading.Thread | None = None
        _warn_if_chat_cannot_end(llm)

    @property
    def host(self) -> str:
        return str(self._sockets[0].getsockname()[0])

    @property
    def port(self) -> int:
        return int(self._sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Server:
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": self._sockets}, name="pydflash-server", daemon=True
        )
        self._thread.start()
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server did not start (see the log)")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM (in the main thread) or ``shutdown()``."""
        self._uvicorn.run(sockets=self._sockets)

    def shutdown(self) -> None:
        """Stop serving (running requests get ``shutdown_grace`` seconds to finish) and close the sockets."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30 + self.shutdown_grace)
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def model_card(self) -> dict[str, Any]:
        llm = self.llm
        meta = {
            "n_ctx": llm.n_ctx_slot,
            "n_ctx_train": llm.core_model.n_ctx_train,
            "n_vocab": llm.n_vocab,
            "n_embd": llm.core_model.n_embd,
            "n_params": llm.core_model.n_params,
            "size": llm.core_model.size_bytes,
            "draft": llm.has_draft,
            "block_size": llm.pair.block_size if llm.has_draft else 0,
        }
        return {
            "id": self.alias,
            "object": "model",
            "created": self.created,
            "owned_by": "pydflash",
            "aliases": self.aliases,
            "tags": self.tags,
            "meta": meta,
        }

    def props(self) -> dict[str, Any]:
        """llama-server's ``GET /props``."""
        llm = self.llm
        model = llm.core_model
        d = {"max_tokens": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": -1}
        d.update(self.defaults)
        params = {
            "n_predict": d["max_tokens"],
            "seed": d["seed"],
            "temperature": d["temperature"],
            "top_k": d["top_k"],
            "top_p": d["top_p"],
            "min_p": d["min_p"],
            "speculative.n_max": d.get("draft_max", llm.pair.max_draft if llm.has_draft else 0),
            "speculative.n_min": d.get("draft_min", 0),
            "speculative.p_min": d.get("draft_p_min", 0.0),
        }
        bos, eos = model.bos, model.eos
        return {
            "default_generation_settings": {"params": params, "n_ctx": llm.n_ctx_slot},
            "total_slots": self.parallel,
            "model_alias": self.alias,
            "model_path": model_file(llm.model_path),
            "draft_model_path": model_file(llm.draft_path) if llm.draft_path else None,
            "modalities": {"vision": False, "video": False, "audio": False},
            "endpoint_slots": self.slots_on,
            "endpoint_props": False,
            "endpoint_metrics": self.metrics_on,
            "ui": False,
            "chat_template": llm.metadata.get("tokenizer.chat_template", ""),
            "bos_token": llm.detokenize([bos], special=True) if bos >= 0 else "",
            "eos_token": llm.detokenize([eos], special=True) if eos >= 0 else "",
            "build_info": "pydflash",
            "is_sleeping": False,
        }

    # -- the application ----------------------------------------------------------

    def _app(self, api_keys: Sequence[str], cors_origins: str, check_host: bool) -> Starlette:
        gets: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/health": self._health,
            "/v1/health": self._health,
            "/v1/models": self._models,
            "/models": self._models,
            "/metrics": self._metrics,
            "/v1/metrics": self._metrics,
            "/slots": self._slots,
        }
        routes = [Route(path, endpoint, methods=["GET"]) for path, endpoint in gets.items()]
        routes.append(Route("/slots/{id_slot}", self._slot_action, methods=["POST"]))
        kinds: tuple[tuple[tuple[str, ...], _Kind], ...] = (
            (("/v1/completions",), CompletionRequest),
            (("/v1/chat/completions", "/chat/completions"), ChatRequest),
            (("/completion", "/completions"), NativeRequest),  # llama-server's: /completions is native
            (("/infill",), InfillRequest),
            (("/v1/messages",), AnthropicRequest),
            (("/v1/responses", "/responses"), ResponsesRequest),
        )
        for paths, kind in kinds:
            routes += [Route(path, _Generations(self, kind), methods=["POST"]) for path in paths]
        routes += native_routes(self)
        return Starlette(
            routes=routes,
            middleware=[
                Middleware(CanonicalHeaders, start_time=self.created),
                Middleware(_CountRequests, metrics=self.metrics),
                Middleware(FramingCheck),
                Middleware(Guard, api_keys=api_keys, cors_origins=cors_origins, check_host=check_host),
            ],
            exception_handlers={HTTPException: _http_error},
        )

    async def _health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        card = self.model_card()
        # llama-server answers both OpenAI's list and Ollama's "models"
        models = [
            {
                "name": self.alias,
                "model": self.alias,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {},
            }
        ]
        return _json({"object": "list", "data": [card], "models": models})

    async def _metrics(self, request: Request) -> Response:
        if not self.metrics_on:
            return error_response(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def _slots(self, request: Request) -> Response:
        if not self.slots_on:
            return error_response(501, "This server does not support slots endpoint. Start it with `--slots`")
        # the slots are read under the engine's lock, which a long prefill may hold
        return _json(await anyio.to_thread.run_sync(self.llm.slots, limiter=self.side_threads))

    async def _slot_action(self, request: Request) -> Response:
        """llama-server's ``POST /slots/{id}?action=save|restore|erase`` (save and
        restore: ``{"filename": ...}`` in ``--slot-save-path``)."""
        if not self.slots_on:
            return error_response(501, "This server does not support slots endpoint. Start it with `--slots`")
        action = request.query_params.get("action", "")
        try:
            slot = int(request.path_params["id_slot"])
            if not 0 <= slot < self.llm.n_parallel:
                raise ValueError
        except ValueError:
            return error_response(400, f"id_slot must be a slot in [0, {self.llm.n_parallel})", "id_slot")
        if action not in ("save", "restore", "erase"):
            return error_response(400, "action must be save, restore or erase", "action")
        raw = await read_body(request, MAX_SLOT_BODY, self.timeout)
        if isinstance(raw, Response):
            return raw
        if action == "erase":
            try:
                n = await anyio.to_thread.run_sync(self.llm.erase_slot, slot, limiter=self.side_threads)
            except PyDFlashError as e:
                return error_response(503 if "busy" in str(e) else 500, str(e))
            return _json({"id_slot": slot, "n_erased": n})
        if self.slot_save_path is None:
            return error_response(501, "slot save and restore need --slot-save-path")
        try:
            body = json.loads(raw or b"{}")
            name = body.get("filename") if isinstance(body, dict) else None
        except ValueError:
            name = None
        if not _plain_file_name(name):
            return error_response(400, "'filename' must be a plain file name", "filename")
        assert isinstance(name, str)
        path = self.slot_save_path / name
        t0 = time.perf_counter()
        run = self.llm.save_slot if action == "save" else self.llm.load_slot
        try:
            await anyio.to_thread.run_sync(run, slot, path, limiter=self.side_threads)
        except ValueError as e:
            return error_response(400, str(e))
        except PyDFlashError as e:
            return error_response(503 if "busy" in str(e) else 500, str(e))
        except OSError as e:
            return error_response(400 if action == "restore" else 500, f"{e.strerror or e}: {name}")
        ms = (time.perf_counter() - t0) * 1e3
        n = len(self.llm.pair.sequence(slot).tokens)
        # llama-server's field names
        tokens, size, took = (
            ("n_saved", "n_written", "save_ms") if action == "save" else ("n_restored", "n_read", "restore_ms")
        )
        return _json({"id_slot": slot, "filename": name, tokens: n, size: path.stat().st_size, "timings": {took: ms}})


def _warn_if_chat_cannot_end(llm: Llama) -> None:
    """A model without a chat template of its own gets ChatML; where its vocabulary has no
    ``<|im_end|>`` token (a base model, as the embedded pair), a chat reply never ends by
    itself and fills the context: say so once, at start."""
    try:
        if not llm.chat_template.is_fallback:
            return
    except PyDFlashError:  # a template that does not parse fails its chat requests, not the server
        return
    ids = llm.core_model.tokenize("<|im_end|>", False, True)
    if len(ids) != 1 or not llm.core_model.is_eog(ids[0]):
        log.warning(
            "%s has no chat template and no <|im_end|> token: chat replies will not end by themselves "
            "(they run to max_tokens, or fill the context without it); use /completion, or give "
            "--chat-template and a chat model",
            llm.model_name,
        )


def _clamped(defaults: dict[str, Any], llm: Llama) -> dict[str, Any]:
    """Draft lengths over what the drafter's block allows are clamped, with a warning (as llama.cpp does)."""
    top = llm.pair.max_draft if llm.has_draft else 0
    for key in ("draft_max", "draft_min"):
        if defaults.get(key, 0) > top:
            log.warning("%s %d is over what the drafter allows (%d): using %d", key, defaults[key], top, top)
            defaults[key] = top
    return defaults


# characters a slot file name may not hold (llama.cpp's fs_validate_filename refuses them too)
_BAD_NAME_CHARS = frozenset('/\\:*?"<>|') | {chr(c) for c in range(32)} | {chr(127)}


def _plain_file_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name.encode("utf-8", "surrogatepass")) <= 255
        and name not in (".", "..")
        and not _BAD_NAME_CHARS.intersection(name)
    )


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


class _Uvicorn(uvicorn.Server):
    """uvicorn's server, with a drain before its shutdown: running requests get the
    grace period to finish; then each is cancelled, and a stream ends with an error
    event and a well-formed end (uvicorn would cut it off mid-body)."""

    def __init__(self, config: uvicorn.Config, owner: Server):
        super().__init__(config)
        self.owner = owner

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        owner = self.owner
        owner.draining = True
        for server in self.servers:
            server.close()  # no new connections
        deadline = time.monotonic() + owner.shutdown_grace
        while owner.in_flight and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        for exchange in list(owner.exchanges):
            exchange.stop()
        deadline = time.monotonic() + 10
        while owner.in_flight and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        await super().shutdown(sockets)


def _json(obj: Any, status: int = 200) -> Response:
    # json.dumps as it is: a logprob may be -Infinity, which Starlette's JSONResponse refuses
    return Response(json.dumps(obj), status, media_type="application/json")


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"no route {request.method} {request.url.path}" if exc.status_code == 404 else exc.detail
    return error_response(exc.status_code, message, headers=exc.headers)


class _CountRequests:
    """``requests_total{endpoint=...}``: every request, by path (others: "other")."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"].rstrip("/")
            self.metrics.request(path if path in ROUTES else "other")
        await self.app(scope, receive, send)


class _Generations:
    """The ASGI app of a generation route: one ``_Exchange`` per request."""

    def __init__(self, server: Server, kind: _Kind):
        self.server = server
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _Exchange(self.server, self.kind, scope, receive, send).run()


class _ClientGone(Exception):
    """The request's client disconnected; nothing more is sent."""


class _Exchange:
    """One generation request, from its body to its response's last byte. The
    worker thread parses, generates and hands its result (or a stream's chunks)
    over a channel; this side sends them, and sets ``gone`` when the client
    leaves (or the server stops): the generation polls it after each step and stops."""

    def __init__(self, server: Server, kind: _Kind, scope: Scope, receive: Receive, send: Send):
        self.server = server
        self.kind = kind
        self.scope, self.receive, self.send = scope, receive, send
        self.gone = threading.Event()
        self.left = False  # the client disconnected before the end of the response
        self.stopped = False  # the server is stopping: the generation was cancelled for it
        self.running = False  # the generation made its first step (worker thread only)
        self.done_marker = True  # the stream ends with "data: [DONE]" (OpenAI's; not llama-server's native)
        self.event_names = False  # each event has an "event: TYPE" line (Anthropic's streams)
        self.keep_timings = True  # the response shows llama-server's timings

    async def run(self) -> None:
        body = await self._body()
        if body is None:
            return
        srv = self.server
        # admitted only now: a client that sends its body slowly holds no place in the queue
        if srv.draining or srv.in_flight >= srv.parallel + srv.queue_size:
            srv.metrics.event("requests_rejected")
            msg = (
                "the server is shutting down"
                if srv.draining
                else f"the server is busy ({srv.in_flight} requests in flight); retry later"
            )
            await error_response(503, msg, headers={"Retry-After": "1"})(self.scope, self.receive, self.send)
            return
        srv.in_flight += 1
        srv.metrics.admitted(1)
        srv.exchanges.add(self)
        try:
            await self._exchange(body)
        finally:
            srv.exchanges.discard(self)
            srv.in_flight -= 1
            srv.metrics.admitted(-1)

    def stop(self) -> None:
        """End it for the server's shutdown: its generation stops at its next step."""
        self.stopped = True
        self.gone.set()

    async def _exchange(self, body: bytes) -> None:
        sender, items = anyio.create_memory_object_stream[_Item](0)
        try:
            async with anyio.create_task_group() as tg, items:
                tg.start_soon(self._worker, body, sender)
                try:
                    await self._answer(items)
                finally:
                    self.gone.set()  # whatever ended the answer ends the generation (at its next step)
        finally:
            if self.left:
                self.server.metrics.event("requests_cancelled")

    async def _body(self) -> bytes | None:
        """The request body, or None when it was refused (413, 408) or the client left."""
        try:
            body = await read_body(Request(self.scope, self.receive), MAX_BODY, self.server.timeout)
        except ClientDisconnect:
            return None
        if isinstance(body, Response):
            self.server.metrics.event("requests_failed")
            await body(self.scope, self.receive, self.send)  # the rest of the body is never read
            return None
        return body

    async def _answer(self, items: ObjectReceiveStream[_Item]) -> None:
        try:
            kind, payload = await self._until_gone(items.receive)
        except _ClientGone:
            return
        if kind == "head":
            response: Response = _EventStream(self, payload, items)
        elif kind == "error":
            status, err = self.error(payload)
            response = _json(err, status)
        else:
            response = _json(payload)
        await response(self.scope, self.receive, self.send)

    async def _until_gone(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()``, unless the client disconnects first (then _ClientGone)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch, tg.cancel_scope)
            result = await fn()
            tg.cancel_scope.cancel()
            return result
        raise _ClientGone  # the watch cancelled fn

    async def _watch(self, scope: anyio.CancelScope) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.client_left()
        scope.cancel()

    def client_left(self) -> None:
        self.left = True
        self.gone.set()

    def error(self, exc: BaseException) -> tuple[int, dict[str, Any]]:
        """(status, llama-server's error object) of an error before or during the generation."""
        self.server.metrics.event("requests_failed")
        if self.stopped and isinstance(exc, GenerationInterrupted):
            return 503, error_body(503, "the server is shutting down")
        if isinstance(exc, ContextLimitError) and exc.n_ctx:
            body = error_body(400, str(exc), kind="exceed_context_size_error")
            body["error"].update(n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
            return 400, body
        status, message, param = _failure(exc)
        return status, error_body(status, message, param)

    # -- the worker thread -----------------------------------------------------------

    async def _worker(self, body: bytes, sender: ObjectSendStream[_Item]) -> None:
        def emit(item: _Item) -> None:
            try:
                anyio.from_thread.run(sender.send, item)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise _ClientGone from None  # the answer ended: the response is done or the client left

        async with sender:
            await anyio.to_thread.run_sync(self._work, body, emit, limiter=self.server.threads)

    def _work(self, body: bytes, emit: Callable[[_Item], None]) -> None:
        """Parse, check, generate; hand over the result, a stream's chunks or the error."""
        try:
            try:
                self._generate(body, emit)
            except _ClientGone:
                raise
            except ValidationError as e:
                emit(("error", describe(e)))
            except Exception as e:
                emit(("error", e))
        except _ClientGone:
            pass
        finally:
            if self.running:
                self.server.metrics.processing(-1)

    def _generate(self, body: bytes, emit: Callable[[_Item], None]) -> None:
        srv = self.server
        req = self.kind.model_validate_json(body)
        req.fill(srv.defaults)
        req.check(srv.llm.n_vocab, srv.parallel)
        # before any tokenizing: a prompt far over the context costs no more than one that fits
        srv.limit.check(req.prompt_bytes())
        out = req.respond(srv.llm, srv.alias, self._cancelled)
        self.done_marker = req.done_marker
        self.event_names = getattr(req, "sse_event_names", False)
        self.keep_timings = getattr(req, "keep_timings", True)  # Anthropic's replies have none
        if not req.stream:
            for one in out if isinstance(out, list) else [out]:
                srv.metrics.generation(one["timings"] if self.keep_timings else one.pop("timings"))
            emit(("result", out))
            return
        chunks = self._counted(out)
        try:
            # the response starts after the first step: what fails at the start (a prompt
            # over n_ctx, a token id out of range) is an HTTP error, not an event
            emit(("head", list(itertools.islice(chunks, req.lead))))
            for chunk in chunks:
                emit(("chunk", chunk))
        finally:
            chunks.close()  # a stream left early ends its generation now (and frees the model)

    def _counted(self, chunks: Iterator[dict[str, Any]]) -> Generator[dict[str, Any], None, None]:
        try:
            for chunk in chunks:
                # the last chunk's timings (the Responses API's: in its final response object)
                timings = chunk.get("timings") or (chunk.get("response") or {}).get("timings")
                if timings:
                    self.server.metrics.generation(timings)
                    if not self.keep_timings:
                        chunk.pop("timings", None)
                yield chunk
        finally:
            chunks.close()  # type: ignore[attr-defined]  # the completion functions return generators

    def _cancelled(self) -> bool:
        """The generation's ``cancel``, asked after each step of a stream and every 0.1 s
        of a whole reply (and before its prompt is evaluated); the first ask marks it running."""
        if not self.running:
            self.running = True
            self.server.metrics.processing(1)
        return self.gone.is_set()


def _failure(exc: BaseException) -> tuple[int, str, str | None]:
    """(status, message, param) of an error before or during a generation."""
    if isinstance(exc, Unsupported):
        return 501, str(exc), exc.param
    if isinstance(exc, BadRequest):
        return 400, str(exc), exc.param
    if isinstance(exc, (ValueError, TypeError)):  # the library's checks (ContextLimitError is one)
        return 400, str(exc), None
    if isinstance(exc, GenerationInterrupted):
        return 500, f"the generation was interrupted: {exc}", None
    if isinstance(exc, PyDFlashError):
        return 500, str(exc), None
    log.error("internal error", exc_info=exc)
    return 500, "internal server error", None


class _EventStream(StreamingResponse):
    """Server-sent events: the head chunks, each chunk as the worker hands it over,
    then ``[DONE]``. An error after the start is one ``{"error": ...}`` event that
    ends the stream (the status line is already sent)."""

    def __init__(self, exchange: _Exchange, head: list[dict[str, Any]], items: ObjectReceiveStream[_Item]):
        self.exchange = exchange
        self.finished = False
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(self._events(head, items), media_type="text/event-stream", headers=headers)

    async def _events(self, head: list[dict[str, Any]], items: ObjectReceiveStream[_Item]) -> AsyncIterator[bytes]:
        named = self.exchange.event_names
        for chunk in head:
            yield _event(chunk, named)
        async for kind, payload in items:
            if kind == "error":
                self.finished = True
                err = self.exchange.error(payload)[1]
                yield _event({"type": "error", **err} if named else err, named)
                return
            yield _event(payload, named)
        self.finished = True
        if self.exchange.done_marker:
            yield b"data: [DONE]\n\n"

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        if not self.finished:
            self.exchange.client_left()


def _event(obj: Any, named: bool = False) -> bytes:
    """One server-sent event; ``named``: with an ``event:`` line of its ``type`` (Anthropic's)."""
    head = f"event: {obj.get('type', 'message')}\n".encode() if named and isinstance(obj, dict) else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def serve(
    model: str,
    draft: str | None = None,
    *,
    parallel: int = 1,
    ready: Callable[[Server], None] | None = None,
    server: Mapping[str, Any] | None = None,
    **llama_kwargs: Any,
) -> None:
    """Load the pair and serve until interrupted (Ctrl-C / SIGTERM). ``server``: the
    keyword arguments of ``Server`` (host, port, api_keys, ...)."""
    with Llama(model, draft=draft, n_parallel=parallel, **llama_kwargs) as llm:
        srv = Server(llm, parallel=parallel, **(server or {}))

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        if threading.current_thread() is threading.main_thread():
            # uvicorn shuts down gracefully on SIGTERM, then raises it again: here, to return
            signal.signal(signal.SIGTERM, stop)
        if ready is not None:
            ready(srv)
        with contextlib.suppress(KeyboardInterrupt):
            srv.serve_forever()
