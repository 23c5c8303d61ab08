"""llama-server's resumable streams: a stream whose request carries ``X-Conversation-Id``
is recorded, byte for byte, in a session under that id. The generation runs on when its
client leaves; ``GET /v1/stream?conv_id=ID&from=N`` replays the bytes from offset N and
follows the live ones until the end, ``DELETE /v1/stream?conv_id=ID`` stops the
generation and forgets the session, ``POST /v1/streams/lookup`` says which of the ids
asked about are live. The id travels in the query string: it may hold a model name
with a slash. Sessions live on the event loop; a finished one expires after
``TTL_S``, and one keeps its last ``MAX_BYTES`` only."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .http import error_body, error_response, json_response, read_body

__all__ = ["HEADER", "StreamSession", "StreamSessions", "stream_routes"]

HEADER = "x-conversation-id"
TTL_S = 300  # llama-server's STREAM_SESSION_TTL_SECONDS
MAX_BYTES = 8 * 1024 * 1024  # a session's buffer: older bytes are dropped (a replay from them is refused)
MAX_SESSIONS = 256  # the oldest finished session goes first past this
MAX_LOOKUP_BODY = 1024 * 1024
MAX_LOOKUP_IDS = 1024  # ids one lookup may ask about (each live session is answered once at most)


class StreamSession:
    """One conversation's recorded stream."""

    def __init__(self, conv_id: str, on_cancel: Callable[[], None], named: bool = False):
        self.conv_id = conv_id
        self.on_cancel = on_cancel  # stops the generation that writes here
        self.named = named  # its events have "event:" lines (Anthropic's, the Responses API's)
        self.data = bytearray()
        self.dropped = 0  # bytes dropped from the front (MAX_BYTES)
        self.done = False
        self.cancelled = False
        self.started_at = int(time.time())
        self.completed_at: int | None = None
        self._wake = anyio.Event()

    @property
    def total(self) -> int:
        return self.dropped + len(self.data)

    def write(self, chunk: bytes) -> None:
        if self.done:
            return  # stopped: what the generation still hands over comes after the end
        self.data += chunk
        if len(self.data) > MAX_BYTES:
            cut = len(self.data) - MAX_BYTES
            del self.data[:cut]
            self.dropped += cut
        self._notify()

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.completed_at = int(time.time())
            self._notify()

    def cancel(self, why: str) -> None:
        """Stop the generation; its readers get one error event saying ``why``, then the end."""
        if not self.done:
            err = error_body(499, why, kind="stream_stopped")
            data = json.dumps({"type": "error", **err} if self.named else err)
            self.write((b"event: error\n" if self.named else b"") + f"data: {data}\n\n".encode())
        self.cancelled = True
        self.on_cancel()
        self.finish()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = anyio.Event()

    async def read(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from ``offset`` on, as they come, until the session ends."""
        while True:
            if offset < self.dropped:
                return  # dropped while this reader was slow: it cannot go on
            if offset < self.total:
                chunk = bytes(self.data[offset - self.dropped :])
                offset += len(chunk)
                yield chunk
                continue
            if self.done:
                return
            await self._wake.wait()


class StreamSessions:
    """The live and recently finished sessions, by conversation id."""

    def __init__(self) -> None:
        self._sessions: dict[str, StreamSession] = {}

    def open(self, conv_id: str, on_cancel: Callable[[], None], named: bool = False) -> StreamSession:
        """A new session for ``conv_id``; one already there is stopped and replaced."""
        self._expire()
        old = self._sessions.pop(conv_id, None)
        if old is not None and not old.done:
            old.cancel("the stream was replaced by a new one under its conversation id")
        session = self._sessions[conv_id] = StreamSession(conv_id, on_cancel, named)
        return session

    def get(self, conv_id: str) -> StreamSession | None:
        self._expire()
        return self._sessions.get(conv_id)

    def forget(self, conv_id: str, session: StreamSession | None = None) -> None:
        """Drop ``conv_id``'s session (only ``session``, when given) without stopping it."""
        if session is None or self._sessions.get(conv_id) is session:
            self._sessions.pop(conv_id, None)

    def stop(self, conv_id: str) -> None:
        """The explicit stop: the generation ends and the session is forgotten."""
        session = self._sessions.pop(conv_id, None)
        if session is not None:
            session.cancel("the stream was stopped: a DELETE named its conversation")

    def lookup(self, ids: list[str]) -> list[dict[str, Any]]:
        """The sessions of the ids asked about (exact, or ``ID::model``); never others, and
        each once, however often it is asked about: the work and the reply grow with the
        sessions and the ids, not with their product."""
        self._expire()
        wanted = set(ids)
        out = []
        for s in self._sessions.values():
            if s.conv_id in wanted or any(p in wanted for p in _prefixes(s.conv_id)):
                out.append(
                    {
                        "conversation_id": s.conv_id,
                        "is_done": s.done,
                        "total_bytes": s.total,
                        "started_at": s.started_at,
                        "completed_at": s.completed_at,
                    }
                )
        return out

    def _expire(self) -> None:
        cutoff = int(time.time()) - TTL_S
        for conv_id, s in list(self._sessions.items()):
            if s.completed_at is not None and s.completed_at < cutoff:
                del self._sessions[conv_id]
        finished = [k for k, s in self._sessions.items() if s.done]
        while len(self._sessions) > MAX_SESSIONS and finished:
            del self._sessions[finished.pop(0)]


def _prefixes(conv_id: str) -> list[str]:
    """The ids whose ``ID::`` starts ``conv_id``: "a::b::c" -> ["a", "a::b"]."""
    parts = conv_id.split("::")
    return ["::".join(parts[:i]) for i in range(1, len(parts))]


def stream_routes(sessions: StreamSessions, timeout: float) -> list[Route]:
    async def replay(request: Request) -> Response:
        conv_id = request.query_params.get("conv_id", "")
        if not conv_id:
            return error_response(400, "Missing conversation id in path")
        session = sessions.get(conv_id)
        if session is None:
            return error_response(404, "Stream not found or expired")
        raw = request.query_params.get("from", "0") or "0"
        if not (raw.isascii() and raw.isdigit()):  # str.isdigit() alone takes "²", which int() does not
            return error_response(400, "Invalid 'from' offset")
        if int(raw) < session.dropped:
            return error_response(400, "Stream offset lost, please restart")
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(session.read(int(raw)), media_type="text/event-stream", headers=headers)

    async def stop(request: Request) -> Response:
        conv_id = request.query_params.get("conv_id", "")
        if not conv_id:
            return error_response(400, "Missing conversation id in path")
        sessions.stop(conv_id)  # idempotent: 204 for a session already gone
        return Response(status_code=204)

    async def lookup(request: Request) -> Response:
        raw = await read_body(request, MAX_LOOKUP_BODY, timeout)
        if isinstance(raw, Response):
            return raw
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            return error_response(400, f"invalid body: {e}")
        ids = body.get("conversation_ids") if isinstance(body, dict) else None
        wanted = [i for i in ids if isinstance(i, str) and i] if isinstance(ids, list) else []
        if len(wanted) > MAX_LOOKUP_IDS:
            return error_response(400, f"'conversation_ids' may hold at most {MAX_LOOKUP_IDS} ids", "conversation_ids")
        return json_response(sessions.lookup(wanted))

    return [
        Route("/v1/stream", replay, methods=["GET"]),
        Route("/v1/stream", stop, methods=["DELETE"]),
        Route("/v1/streams/lookup", lookup, methods=["POST"]),
    ]
