"""``pydflash serve``: an OpenAI-compatible HTTP server for one target + DFlash
drafter pair, on Starlette and uvicorn (``pip install pydflash[server]``).

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``:
server-sent events), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(Prometheus, with DFlash's speculative counters), and a chat page at ``GET /``
(server/webui.py; ``webui=False``: off). Each generation request runs
in one worker thread of its own, from parsing its body to its last chunk; the
model schedules the generations (``Llama(n_parallel=N)`` batches N of them), the
server does not serialise them. At most ``parallel + queue_size`` requests are
admitted at once (others: 503). A client that disconnects cancels its own
generation."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import anyio
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute, Route
    from starlette.types import ASGIApp, Receive, Scope, Send

    from .anthropic import AnthropicRequest
    from .exchange import MAX_BODY, Exchange, Generations, Kind
    from .gcp import GcpConfig, predict_routes
    from .http import CanonicalHeaders, FramingCheck, error_response, json_response, protocol
    from .limits import PromptLimit
    from .metrics import Metrics
    from .native import InfillRequest, NativeRequest
    from .requests import ChatRequest, CompletionRequest
    from .responses import ResponsesRequest
    from .routes_native import model_file, native_routes
    from .security import Guard, loopback_only
    from .sleep import Sleep, WakeOnUse
    from .slots import SlotRoutes
    from .streams import StreamSessions, stream_routes
    from .webui import WebUI
except ImportError as e:  # the optional dependencies of the server extra
    raise ImportError(f"pydflash serve needs {e.name}: pip install pydflash[server]") from e

from ..errors import PyDFlashError
from ..llama import Llama

__all__ = ["MAX_BODY", "Server", "serve"]

log = logging.getLogger("pydflash.server")


def _bind(hosts: Sequence[str], port: int) -> list[socket.socket]:
    """A listening socket per address; port 0: the first address's free port, for all of them."""
    if not hosts:
        raise ValueError("host: give at least one address")
    sockets: list[socket.socket] = []
    for h in hosts:
        taken = sockets[0].getsockname()[1] if sockets else port
        family = socket.AF_INET6 if ":" in h else socket.AF_INET
        sockets.append(socket.create_server((h.strip("[]"), taken), family=family))
        # accepted connections inherit it; asyncio sets it only on sockets made with proto
        # IPPROTO_TCP (these have 0): without it, a stream's first small write after the head
        # waits for a keep-alive client's delayed ACK (40 ms on Linux)
        sockets[-1].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sockets


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
    get to finish when the server stops, before streams end with an error event;
    ``sleep_idle_seconds``: free the model after that long unused, reload it on the
    next request that needs it (server/sleep.py); ``webui``: the chat page at ``/``."""

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
        sleep_idle_seconds: float | None = None,
        webui: bool = True,
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
        self.webui = WebUI() if webui else None  # the chat page's files, read now: a broken install fails here
        self.defaults = _clamped(dict(defaults or {}), llm)  # request fields' defaults (-n, --temp, ...)
        self.shutdown_grace = shutdown_grace
        self.limit = PromptLimit(llm)
        self.created = int(time.time())
        self.in_flight = 0  # admitted requests (read and written on the event loop only)
        self.draining = False  # the server is stopping: admit nothing more
        self.exchanges: set[Exchange] = set()  # the admitted generation requests
        # each admitted request holds one thread: never wait for another request's
        self.threads = anyio.CapacityLimiter(self.parallel + self.queue_size)
        self.side_threads = anyio.CapacityLimiter(4)  # /slots, slot files, tokenizing: off the event loop
        self.streams = StreamSessions()  # the streams recorded under a conversation id
        self.gcp = GcpConfig.from_env(os.environ)
        if self.gcp.enabled:  # llama-server's Vertex AI mode: AIP_HTTP_PORT wins over --port
            port = self.gcp.port
        hosts = [host] if isinstance(host, str) else list(host)
        self._sockets = _bind(hosts, port)
        self.sleep = None if sleep_idle_seconds is None else Sleep(llm, sleep_idle_seconds, self._snapshot)
        self._labels = _RouteLabels()  # requests_total's endpoint labels: the app's route table
        app = self._app(api_keys, cors_origins, check_host=loopback_only(hosts))
        self._labels.load(app.router.routes)
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
        if self.sleep is not None:
            self.sleep.start()

    @property
    def host(self) -> str:
        """The address the server listens on (the first, with several hosts)."""
        return str(self._sockets[0].getsockname()[0])

    @property
    def port(self) -> int:
        """The port the server listens on (the real one when ``port=0`` was given)."""
        return int(self._sockets[0].getsockname()[1])

    @property
    def routes(self) -> list[tuple[str, tuple[str, ...]]]:
        """The route table in match order: each route's path (its label in
        ``requests_total{endpoint=...}``) and methods."""
        return [(path, methods) for path, methods, _ in self._labels.table]

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
        """The model's entry in ``GET /v1/models``: its id, and the pair's facts under ``meta``."""
        llm = self.llm
        meta = {
            "n_ctx": llm.n_ctx_slot,
            "n_ctx_train": llm.core_model.n_ctx_train,
            "n_vocab": llm.n_vocab(),
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
        if self.sleep is not None and self.sleep.sleeping:
            return dict(self.sleep.cached["props"])
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
            "ui": self.webui is not None,
            "chat_template": llm.metadata.get("tokenizer.chat_template", ""),
            "bos_token": llm.detokenize([bos], special=True).decode("utf-8", "replace") if bos >= 0 else "",
            "eos_token": llm.detokenize([eos], special=True).decode("utf-8", "replace") if eos >= 0 else "",
            "build_info": "pydflash",
            "is_sleeping": False,
            # pydflash's: what the chat page's model card shows beside the files
            "pair": {
                "drafter_kind": llm.pair.drafter_kind,
                "drafter": llm.pair.drafter_description,
                "block_size": llm.pair.block_size if llm.has_draft else 0,
                "rollback": llm.rollback,
            },
        }

    def _snapshot(self) -> dict[str, Any]:
        """What /props, /models and /metrics answer while the model sleeps (taken awake)."""
        return {
            "props": {**self.props(), "is_sleeping": True},
            "models": self._models_body(),
            "metrics": self.metrics.render(),
        }

    # -- the application ----------------------------------------------------------

    def _app(self, api_keys: Sequence[str], cors_origins: str, check_host: bool) -> Starlette:
        slots = SlotRoutes(self, self.slots_on, self.slot_save_path)
        gets: dict[str, Callable[[Request], Awaitable[Response]]] = {
            "/health": self._health,
            "/v1/health": self._health,
            "/v1/models": self._models,
            "/models": self._models,
            "/metrics": self._metrics,
            "/v1/metrics": self._metrics,
            "/slots": slots.slots,
        }
        routes = [Route(path, endpoint, methods=["GET"]) for path, endpoint in gets.items()]
        routes.append(Route("/slots/{id_slot}", slots.action, methods=["POST"]))
        kinds: tuple[tuple[tuple[str, ...], Kind], ...] = (
            (("/v1/completions",), CompletionRequest),
            (("/v1/chat/completions", "/chat/completions"), ChatRequest),
            (("/completion", "/completions"), NativeRequest),  # llama-server's: /completions is native
            (("/infill",), InfillRequest),
            (("/v1/messages",), AnthropicRequest),
            (("/v1/responses", "/responses"), ResponsesRequest),
        )
        for paths, kind in kinds:
            routes += [Route(path, Generations(self, kind), methods=["POST"]) for path in paths]
        routes += native_routes(self)
        routes += stream_routes(self.streams, self.timeout)
        routes += self.webui.routes() if self.webui is not None else []
        app = Starlette(
            routes=routes,
            middleware=[
                Middleware(CanonicalHeaders, start_time=self.created),
                Middleware(_CountRequests, metrics=self.metrics, labels=self._labels),
                Middleware(FramingCheck),
                Middleware(Guard, api_keys=api_keys, cors_origins=cors_origins, check_host=check_host),
                *([] if self.sleep is None else [Middleware(WakeOnUse, sleep=self.sleep)]),
            ],
            exception_handlers={HTTPException: _http_error},
        )
        if self.gcp.enabled:  # dispatched into the router: the predict request passed the middleware
            app.router.routes += predict_routes(self.gcp, app.router, routes, routes[0])
        return app

    async def _health(self, request: Request) -> Response:
        return json_response({"status": "ok"})

    async def _models(self, request: Request) -> Response:
        if self.sleep is not None and self.sleep.sleeping:
            return json_response(self.sleep.cached["models"])
        return json_response(self._models_body())

    def _models_body(self) -> dict[str, Any]:
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
        return {"object": "list", "data": [card], "models": models}

    async def _metrics(self, request: Request) -> Response:
        if not self.metrics_on:
            return error_response(501, "This server does not support metrics endpoint. Start it with `--metrics`")
        asleep = self.sleep is not None and self.sleep.sleeping
        text = self.sleep.cached["metrics"] if self.sleep is not None and asleep else self.metrics.render()
        return Response(text, media_type=self.metrics.content_type)


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
    top = llm.pair.max_draft  # a drafter's block, or the MTP heads'
    if top <= 0:  # no model drafter (n-gram drafts alone): nothing to clamp against
        return defaults
    for key in ("draft_max", "draft_min"):
        if defaults.get(key, 0) > top:
            log.warning("%s %d is over what the drafter allows (%d): using %d", key, defaults[key], top, top)
            defaults[key] = top
    return defaults


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
        if owner.sleep is not None:
            owner.sleep.stop()
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


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = f"no route {request.method} {request.url.path}" if exc.status_code == 404 else exc.detail
    return error_response(exc.status_code, message, headers=exc.headers)


class _RouteLabels:
    """The app's routes as ``requests_total``'s labels: a request's is the path of the route
    it names (a parameter's template, ``/slots/{id_slot}``), any other's "other" (the labels
    stay the table's, whatever paths clients send)."""

    def __init__(self) -> None:
        self.table: list[tuple[str, tuple[str, ...], re.Pattern[str]]] = []
        self._static: dict[str, str] = {}

    def load(self, routes: Sequence[BaseRoute]) -> None:
        for r in routes:
            if isinstance(r, Route):
                self.table.append((r.path, tuple(sorted(r.methods or ())), r.path_regex))
                if not r.param_convertors:
                    self._static[r.path] = r.path

    def label(self, path: str) -> str:
        path = path.rstrip("/") or "/"
        found = self._static.get(path)
        if found is not None:
            return found
        return next((p for p, _, regex in self.table if regex.match(path)), "other")


class _CountRequests:
    """``requests_total{endpoint=...}``: every request, by its route (others: "other")."""

    def __init__(self, app: ASGIApp, metrics: Metrics, labels: _RouteLabels) -> None:
        self.app = app
        self.metrics = metrics
        self.labels = labels

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.metrics.request(self.labels.label(scope["path"]))
        await self.app(scope, receive, send)


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
