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
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
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

    from .http import FramingCheck, HTTPProtocol, error_body, error_response
    from .metrics import Metrics
    from .requests import BadRequest, ChatRequest, CompletionRequest, describe
except ImportError as e:  # the optional dependencies of the server extra
    raise ImportError(f"pydflash serve needs {e.name}: pip install pydflash[server]") from e

from ..errors import GenerationInterrupted, PyDFlashError
from ..llama import Llama

__all__ = ["Server", "serve"]

log = logging.getLogger("pydflash.server")

MAX_BODY = 32 * 1024 * 1024
ROUTES = {
    "/health",
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
_Kind = type[CompletionRequest] | type[ChatRequest]
T = TypeVar("T")


class Server:
    """One model pair behind an HTTP server. ``start()`` serves from a thread (for
    tests and embedding) and returns once it listens; ``serve_forever()`` serves in
    the calling thread. ``port=0`` picks a free port (``.port`` is the real one).

    ``parallel``: the generations the model runs at once (its ``n_parallel``);
    ``queue_size``: admitted requests beyond those (default 4 x parallel, at least
    8); ``timeout``: seconds a client has to send its request body;
    ``timeout_keep_alive``: an idle connection (or one whose request head is not
    complete) is closed after it; ``max_connections``: uvicorn answers 503 past it."""

    def __init__(
        self,
        llm: Llama,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        alias: str | None = None,
        parallel: int | None = None,
        queue_size: int | None = None,
        timeout: float = 60.0,
        timeout_keep_alive: int = 5,
        max_connections: int = 256,
        slot_save_path: str | os.PathLike[str] | None = None,
    ):
        parallel = llm.n_parallel if parallel is None else parallel
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        self.llm = llm
        self.alias = alias or llm.model_name
        self.parallel = parallel
        self.queue_size = max(8, 4 * parallel) if queue_size is None else queue_size
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {self.queue_size}")
        self.timeout = timeout
        self.slot_save_path = None if slot_save_path is None else Path(slot_save_path)
        self.metrics = Metrics(max_accepted=max(1, llm.pair.max_draft) if llm.has_draft else 1, slots=parallel)
        self.created = int(time.time())
        self.in_flight = 0  # admitted requests (read and written on the event loop only)
        # each admitted request holds one thread: never wait for another request's
        self.threads = anyio.CapacityLimiter(self.parallel + self.queue_size)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.create_server((host, port), family=family)
        config = uvicorn.Config(
            self._app(),
            http=HTTPProtocol,
            ws="none",
            lifespan="off",
            loop="asyncio",
            log_config=None,  # the embedding program's logging, untouched
            server_header=False,  # ours names no versions
            headers=[("server", "pydflash")],
            timeout_keep_alive=timeout_keep_alive,
            limit_concurrency=max_connections,
            timeout_graceful_shutdown=5,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        """The address the server listens on."""
        return str(self._socket.getsockname()[0])

    @property
    def port(self) -> int:
        """The port the server listens on (the real one when ``port=0`` was given)."""
        return int(self._socket.getsockname()[1])

    @property
    def url(self) -> str:
        """``http://host:port``, the base of every endpoint."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> Server:
        """Serve from a daemon thread and return once the server listens.

        Returns:
            This server (so that ``srv = Server(llm).start()`` reads well).

        Raises:
            RuntimeError: The server thread ended before it listened.
        """
        self._thread = threading.Thread(
            target=self._uvicorn.run, kwargs={"sockets": [self._socket]}, name="pydflash-server", daemon=True
        )
        self._thread.start()
        while not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server did not start (see the log)")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM (in the main thread) or ``shutdown()``."""
        self._uvicorn.run(sockets=[self._socket])

    def shutdown(self) -> None:
        """Stop serving (running requests get a few seconds to finish) and close the socket."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._socket.close()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def model_card(self) -> dict[str, Any]:
        """The model's entry in ``GET /v1/models``: its id, and the pair's facts under ``meta``."""
        llm = self.llm
        meta = {
            "n_ctx": llm.n_ctx(),
            "n_vocab": llm.n_vocab(),
            "draft": llm.has_draft,
            "block_size": llm.pair.block_size if llm.has_draft else 0,
        }
        return {"id": self.alias, "object": "model", "created": self.created, "owned_by": "pydflash", "meta": meta}

    # -- the application ----------------------------------------------------------

    def _app(self) -> Starlette:
        gets: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/health": self._health,
            "/v1/models": self._models,
            "/models": self._models,
            "/metrics": self._metrics,
            "/slots": self._slots,
        }
        routes = [Route(path, endpoint, methods=["GET"]) for path, endpoint in gets.items()]
        routes.append(Route("/slots/{id_slot}", self._slot_action, methods=["POST"]))
        for paths, kind in (
            (("/v1/completions", "/completions"), CompletionRequest),
            (("/v1/chat/completions", "/chat/completions"), ChatRequest),
        ):
            routes += [Route(path, _Generations(self, kind), methods=["POST"]) for path in paths]
        return Starlette(
            routes=routes,
            middleware=[Middleware(_CountRequests, metrics=self.metrics), Middleware(FramingCheck)],
            exception_handlers={HTTPException: _http_error},
        )

    async def _health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        return _json({"object": "list", "data": [self.model_card()]})

    async def _metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def _slots(self, request: Request) -> Response:
        return _json(self.llm.slots())

    async def _slot_action(self, request: Request) -> Response:
        """llama-server's ``POST /slots/{id}?action=save|restore|erase`` (save and
        restore: ``{"filename": ...}`` in ``--slot-save-path``)."""
        action = request.query_params.get("action", "")
        try:
            slot = int(request.path_params["id_slot"])
            if not 0 <= slot < self.llm.n_parallel:
                raise ValueError
        except ValueError:
            return error_response(400, f"id_slot must be a slot in [0, {self.llm.n_parallel})", "id_slot")
        if action == "erase":
            n = await anyio.to_thread.run_sync(self.llm.erase_slot, slot)
            return _json({"id_slot": slot, "n_erased": n})
        if action not in ("save", "restore"):
            return error_response(400, "action must be save, restore or erase", "action")
        if self.slot_save_path is None:
            return error_response(501, "slot save and restore need --slot-save-path")
        try:
            body = json.loads(await request.body() or b"{}")
            name = body.get("filename") if isinstance(body, dict) else None
        except ValueError:
            name = None
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            return error_response(400, "'filename' must be a plain file name", "filename")
        path = self.slot_save_path / name
        t0 = time.perf_counter()
        try:
            if action == "save":
                await anyio.to_thread.run_sync(self.llm.save_slot, slot, path)
            else:
                await anyio.to_thread.run_sync(self.llm.load_slot, slot, path)
        except ValueError as e:
            return error_response(400, str(e))
        except PyDFlashError as e:
            return error_response(503 if "busy" in str(e) else 500, str(e))
        ms = (time.perf_counter() - t0) * 1e3
        n = len(self.llm.pair.sequence(slot).tokens)
        # llama-server's field names
        tokens, size, took = (
            ("n_saved", "n_written", "save_ms") if action == "save" else ("n_restored", "n_read", "restore_ms")
        )
        return _json({"id_slot": slot, "filename": name, tokens: n, size: path.stat().st_size, "timings": {took: ms}})


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
        srv = self.server
        if srv.in_flight >= srv.parallel + srv.queue_size:
            srv.metrics.event("requests_rejected")
            msg = f"the server is busy ({srv.in_flight} requests in flight); retry later"
            await error_response(503, msg, headers={"Retry-After": "1"})(scope, receive, send)
            return
        srv.in_flight += 1
        srv.metrics.admitted(1)
        try:
            await _Exchange(srv, self.kind, scope, receive, send).run()
        finally:
            srv.in_flight -= 1
            srv.metrics.admitted(-1)


class _ClientGone(Exception):
    """The request's client disconnected; nothing more is sent."""


class _Exchange:
    """One generation request, from its body to its response's last byte. The
    worker thread parses, generates and hands its result (or a stream's chunks)
    over a channel; this side sends them, and sets ``gone`` when the client
    leaves: the generation polls it after each step and stops."""

    def __init__(self, server: Server, kind: _Kind, scope: Scope, receive: Receive, send: Send):
        self.server = server
        self.kind = kind
        self.scope, self.receive, self.send = scope, receive, send
        self.gone = threading.Event()
        self.left = False  # the client disconnected before the end of the response
        self.running = False  # the generation made its first step (worker thread only)

    async def run(self) -> None:
        body = await self._body()
        if body is None:
            return
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
        """The request body, or None when it was refused (413, 408, 400) or the client left."""
        request = Request(self.scope, self.receive)
        declared = request.headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > MAX_BODY:
            await self._refuse(413, f"request body is over {MAX_BODY} bytes")
            return None
        body = bytearray()
        try:
            with anyio.fail_after(self.server.timeout):
                async for part in request.stream():
                    body += part
                    if len(body) > MAX_BODY:
                        await self._refuse(413, f"request body is over {MAX_BODY} bytes")
                        return None
        except TimeoutError:
            await self._refuse(408, f"the request body did not arrive within {self.server.timeout:g} s")
            return None
        except ClientDisconnect:
            return None
        return bytes(body)

    async def _refuse(self, status: int, message: str) -> None:
        # the rest of the body is never read: the connection closes after the answer
        self.server.metrics.event("requests_failed")
        await error_response(status, message, headers={"Connection": "close"})(self.scope, self.receive, self.send)

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
        """(status, OpenAI error object) of an error before or during the generation."""
        status, message, param = _failure(exc)
        self.server.metrics.event("requests_failed")
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
        req.check(srv.llm.n_vocab(), srv.parallel)
        first, kw = req.arguments()
        create: Callable[..., Any] = (
            srv.llm.create_completion if isinstance(req, CompletionRequest) else srv.llm.create_chat_completion
        )
        # the prompt is tokenized (and a chat template applied) here, in this thread
        out = create(first, stream=bool(req.stream), model=srv.alias, cancel=self._cancelled, **kw)
        if not req.stream:
            srv.metrics.generation(out["timings"])
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
                if "timings" in chunk:
                    self.server.metrics.generation(chunk["timings"])
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
        for chunk in head:
            yield _event(chunk)
        async for kind, payload in items:
            if kind == "error":
                self.finished = True
                yield _event(self.exchange.error(payload)[1])
                return
            yield _event(payload)
        self.finished = True
        yield b"data: [DONE]\n\n"

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        if not self.finished:
            self.exchange.client_left()


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def serve(
    model: str,
    draft: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    alias: str | None = None,
    parallel: int = 1,
    queue_size: int | None = None,
    timeout: float = 60.0,
    max_connections: int = 256,
    slot_save_path: str | None = None,
    ready: Callable[[Server], None] | None = None,
    **llama_kwargs: Any,
) -> None:
    """Load the pair and serve until interrupted (Ctrl-C / SIGTERM)."""
    with Llama(model, draft=draft, n_parallel=parallel, **llama_kwargs) as llm:
        srv = Server(
            llm,
            host=host,
            port=port,
            alias=alias,
            parallel=parallel,
            queue_size=queue_size,
            timeout=timeout,
            max_connections=max_connections,
            slot_save_path=slot_save_path,
        )

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        if threading.current_thread() is threading.main_thread():
            # uvicorn shuts down gracefully on SIGTERM, then raises it again: here, to return
            signal.signal(signal.SIGTERM, stop)
        if ready is not None:
            ready(srv)
        with contextlib.suppress(KeyboardInterrupt):
            srv.serve_forever()
