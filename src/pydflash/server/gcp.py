"""Google Cloud Vertex AI's custom-container protocol, as llama-server speaks it
(server-http.cpp): with ``AIP_MODE=PREDICTION`` the server listens on
``AIP_HTTP_PORT``, answers ``POST AIP_PREDICT_ROUTE`` (default ``/predict``) and,
when ``AIP_HEALTH_ROUTE`` is set, ``GET`` there as ``/health``.

A predict body is ``{"instances": [...]}``; each instance names the route it is
for in ``@requestFormat`` (a path, or its camelCase alias: ``chatCompletions`` for
``/v1/chat/completions``) and is that route's body. The instances run at once, each
through the server's own route (its admission and limits), never streamed; the
answer is ``{"predictions": [...]}``, each the route's JSON body or an error object."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Scope

from .http import error_body, error_response, json_response, read_json_object

__all__ = ["MAX_INSTANCES", "GcpConfig", "gcp_alias", "predict_routes"]

MAX_INSTANCES = 128  # llama-server's cap on one predict body
_MAX_PREDICT_BODY = 64 * 1024 * 1024


@dataclass(frozen=True)
class GcpConfig:
    enabled: bool
    port: int
    predict_route: str
    health_route: str  # "" for none beyond /health

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GcpConfig:
        def route(name: str, default: str) -> str:
            value = env.get(name) or default
            return value if not value or value.startswith("/") else "/" + value

        return cls(
            enabled=env.get("AIP_MODE", "") == "PREDICTION",
            port=int(env.get("AIP_HTTP_PORT") or 8080),
            predict_route=route("AIP_PREDICT_ROUTE", "/predict"),
            health_route=route("AIP_HEALTH_ROUTE", ""),
        )


def gcp_alias(path: str) -> str:
    """``/v1/chat/completions`` -> ``chatCompletions``, ``/apply-template`` -> ``applyTemplate``."""
    s = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    out: list[str] = []
    cap = False
    for c in s.lstrip("/"):
        if c in ":{":  # path parameters
            break
        if c in "/-_":
            cap = True
        else:
            out.append(c.upper() if cap else c)
            cap = False
    return "".join(out)


def predict_routes(config: GcpConfig, app: ASGIApp, routes: list[Route], health: Route) -> list[Route]:
    """The predict route (and the health alias) for the server's ``routes``, each
    instance dispatched into ``app`` (the router, behind the server's middleware)."""
    if any(r.path == config.predict_route for r in routes):
        raise ValueError(f"AIP_PREDICT_ROUTE={config.predict_route} conflicts with an existing route")
    targets: dict[str, Route] = {}
    for r in routes:
        if "{" not in r.path:
            targets.setdefault(r.path, r)
            targets.setdefault(gcp_alias(r.path), r)  # the first registration wins, as llama-server's

    async def predict(request: Request) -> Response:
        data = await read_json_object(request, _MAX_PREDICT_BODY, 60.0)
        if isinstance(data, Response):
            return data
        instances = data.get("instances")
        if not isinstance(instances, list):
            return error_response(400, "request body must include an array field named instances")
        if len(instances) > MAX_INSTANCES:
            return error_response(400, f"instances array exceeds maximum size of {MAX_INSTANCES}")
        predictions: list[Any] = [None] * len(instances)

        async def one(i: int) -> None:
            predictions[i] = await _instance(app, targets, request.scope, instances[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(instances)):
                tg.start_soon(one, i)
        return json_response({"predictions": predictions})

    out = [Route(config.predict_route, predict, methods=["POST"])]
    if config.health_route:
        out.append(Route(config.health_route, health.endpoint, methods=["GET"]))
    return out


async def _instance(app: ASGIApp, targets: dict[str, Route], outer: Scope, instance: Any) -> Any:
    if not isinstance(instance, dict):
        return error_body(400, "each instance must be a JSON object")
    fmt = instance.get("@requestFormat")
    if not isinstance(fmt, str):
        return error_body(400, "each instance must include a string @requestFormat")
    route = targets.get(fmt)
    if route is None:
        return error_body(400, f"no handler registered for @requestFormat: {fmt}")
    payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
    if "stream" in payload:
        payload["stream"] = False  # the predict route answers one JSON body per instance
    method = "POST" if "POST" in (route.methods or ()) else "GET"
    status, body = await _call(app, outer, route.path, method, json.dumps(payload).encode())
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace") if status < 400 else error_body(status, body.decode())


async def _call(app: ASGIApp, outer: Scope, path: str, method: str, body: bytes) -> tuple[int, bytes]:
    """Run one request through ``app`` in process: (status, body)."""
    headers = [(k, v) for k, v in outer.get("headers", []) if k not in (b"content-length", b"transfer-encoding")]
    headers.append((b"content-length", str(len(body)).encode()))
    scope = {**outer, "path": path, "raw_path": path.encode(), "method": method, "headers": headers}
    scope.pop("router", None)
    scope.pop("endpoint", None)
    scope.pop("path_params", None)
    sent = False
    finished = anyio.Event()
    status = 500
    parts: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # the instance's client is this request: it stays until the answer
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    return status, b"".join(parts)
