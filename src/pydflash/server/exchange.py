"""One generation request, from its body to its response's last byte: admission
(once the body is whole), the worker thread that parses, checks and generates, the
answer (JSON, or server-sent events), cancellation when the client leaves or the
server stops, and the errors as llama-server's JSON error objects."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..errors import ContextLimitError, GenerationInterrupted, PyDFlashError
from .base import BadRequest, NoVision, ServerRequest, Unsupported
from .handoff import Handoff, HandoffClosed
from .http import error_body, error_response, json_response, read_body
from .requests import describe
from .streams import HEADER

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["MAX_BODY", "Exchange", "Generations", "Kind"]

log = logging.getLogger("pydflash.server")

MAX_BODY = 32 * 1024 * 1024
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# what a worker hands to its request: ("result" | "head" | "chunk" | "error", payload); a
# result's JSON and the events are bytes, encoded in the worker's thread
_Item = tuple[str, Any]
Kind = type[ServerRequest]
T = TypeVar("T")


class Generations:
    """The ASGI app of a generation route: one ``_Exchange`` per request."""

    def __init__(self, server: ServerState, kind: Kind):
        self.server = server
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await Exchange(self.server, self.kind, scope, receive, send).run()


class _ClientGone(Exception):
    """The request's client disconnected; nothing more is sent."""


class Exchange:
    """One generation request, from its body to its response's last byte. The
    worker thread parses, generates and hands its result (or a stream's chunks)
    over a channel; this side sends them, and sets ``gone`` when the client
    leaves (or the server stops): the generation polls it after each step and stops."""

    def __init__(self, server: ServerState, kind: Kind, scope: Scope, receive: Receive, send: Send):
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
        items = Handoff[_Item](asyncio.get_running_loop())
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._worker, body, items)
                try:
                    await self._answer(items)
                finally:
                    items.close()
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

    async def _answer(self, items: Handoff[_Item]) -> None:
        try:
            kind, payload = await self._until_gone(items.get)
        except (_ClientGone, StopAsyncIteration):  # (the worker hands over something unless its client left)
            return
        if kind == "head":
            conv_id = Headers(scope=self.scope).get(HEADER, "")
            if conv_id:
                await self._recorded(conv_id, payload, items)
                return
            response: Response = _EventStream(self, payload, items)
        elif kind == "error":
            status, err = self.error(payload)
            response = json_response(err, status)
        else:  # the reply's JSON, written in the worker's thread: a large one keeps no other request waiting
            response = Response(payload, 200, media_type="application/json")
        await response(self.scope, self.receive, self.send)

    async def _recorded(self, conv_id: str, head: list[bytes], items: Handoff[_Item]) -> None:
        """A stream recorded under its conversation id (streams.py): the client reads the
        session, and the generation runs on, into it, when the client leaves."""
        session = self.server.streams.open(conv_id, self.gone.set, self.event_names)

        async def record() -> None:
            try:
                async for chunk in self.events(head, items):
                    session.write(chunk)
            finally:
                session.finish()

        async with anyio.create_task_group() as tg:
            tg.start_soon(record)
            response = StreamingResponse(session.read(0), media_type="text/event-stream", headers=_SSE_HEADERS)
            await response(self.scope, self.receive, self.send)

    async def events(
        self, head: list[bytes], items: Handoff[_Item], ended: Callable[[], None] = lambda: None
    ) -> AsyncIterator[bytes]:
        """A stream's server-sent events: the head's, each chunk's as the worker hands it
        over (those that waited while the loop was busy in one write), then ``[DONE]``;
        an error after the start is one ``{"error": ...}`` event that ends it. ``ended`` is
        called before the last bytes."""
        for event in head:
            yield event
        async for item in items:
            out = []
            for kind, payload in [item, *items.drain()]:
                if kind == "error":
                    ended()
                    err = self.error(payload)[1]
                    out.append(_event({"type": "error", **err} if self.event_names else err, self.event_names))
                    yield b"".join(out)
                    return
                out.append(payload)  # its event, written in the worker's thread
            yield b"".join(out)
        ended()
        if self.done_marker:
            yield b"data: [DONE]\n\n"

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

    async def _worker(self, body: bytes, items: Handoff[_Item]) -> None:
        def emit(item: _Item) -> None:
            try:
                items.put(item)
            except HandoffClosed:
                raise _ClientGone from None  # the answer ended: the response is done or the client left

        try:
            await anyio.to_thread.run_sync(self._work, body, emit, limiter=self.server.threads)
        finally:
            items.end()

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
        req.check(srv.llm.n_vocab(), srv.parallel)
        # before any tokenizing: a prompt far over the context costs no more than one that fits
        srv.limit.check(req.prompt_bytes())
        out = req.respond(srv.llm, srv.alias, self._cancelled)
        self.done_marker = req.done_marker
        self.event_names = req.sse_event_names
        self.keep_timings = req.keep_timings  # Anthropic's replies have none
        if not req.stream:
            for one in out if isinstance(out, list) else [out]:
                srv.metrics.generation(one["timings"], one.get("speculative"))
                if not self.keep_timings:
                    one.pop("timings")
                    one.pop("speculative", None)
            emit(("result", json.dumps(out).encode()))
            return
        chunks = self._counted(out)
        try:
            # the response starts after the first step: what fails at the start (a prompt
            # over n_ctx, a token id out of range) is an HTTP error, not an event
            emit(("head", [_event(c, self.event_names) for c in itertools.islice(chunks, req.lead)]))
            for chunk in chunks:
                emit(("chunk", _event(chunk, self.event_names)))
        finally:
            chunks.close()  # a stream left early ends its generation now (and frees the model)

    def _counted(self, chunks: Iterator[dict[str, Any]]) -> Generator[dict[str, Any], None, None]:
        try:
            for chunk in chunks:
                # the last chunk's timings (the Responses API's: in its final response object);
                # a chunk of timings_per_token's has no "accepted_lengths": the generation goes on
                timings = chunk.get("timings") or (chunk.get("response") or {}).get("timings")
                if timings and ("accepted_lengths" in (chunk.get("speculative") or {}) or "response" in chunk):
                    self.server.metrics.generation(timings, chunk.get("speculative"))
                    if not self.keep_timings:
                        chunk.pop("timings", None)
                        chunk.pop("speculative", None)
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
    if isinstance(exc, NoVision):
        return 500, str(exc), exc.param
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

    def __init__(self, exchange: Exchange, head: list[bytes], items: Handoff[_Item]):
        self.exchange = exchange
        self.finished = False
        events = exchange.events(head, items, self._ended)
        super().__init__(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    def _ended(self) -> None:
        self.finished = True

    async def listen_for_disconnect(self, receive: Receive) -> None:
        await super().listen_for_disconnect(receive)
        if not self.finished:
            self.exchange.client_left()


def _event(obj: Any, named: bool = False) -> bytes:
    """One server-sent event; ``named``: with an ``event:`` line of its ``type`` (Anthropic's)."""
    head = f"event: {obj.get('type', 'message')}\n".encode() if named and isinstance(obj, dict) else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"
