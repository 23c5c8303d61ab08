"""What the request machinery reads of the server (``Server`` provides it), so
that the exchange and the routes need not import the app that mounts them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import anyio

    from ..llama import Llama
    from .limits import PromptLimit
    from .metrics import Metrics
    from .streams import StreamSessions

__all__ = ["ServerState"]


class ServerState(Protocol):
    """A running server's state: its model, limits, counters and threads."""

    llm: Llama
    alias: str
    parallel: int
    queue_size: int
    timeout: float
    defaults: dict[str, Any]
    limit: PromptLimit
    metrics: Metrics
    in_flight: int
    draining: bool
    exchanges: set[Any]  # the admitted exchanges (exchange.Exchange, which reads this state)
    threads: anyio.CapacityLimiter
    side_threads: anyio.CapacityLimiter
    streams: StreamSessions  # the recorded streams (X-Conversation-Id)

    def props(self) -> dict[str, Any]: ...
