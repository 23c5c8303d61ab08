"""llama-server's small native endpoints: ``/tokenize``, ``/detokenize``,
``/apply-template``, ``/chat/completions/input_tokens``, ``GET /props``, and the
endpoints of features pydflash does not have (501, naming the feature). Each
request's work runs off the event loop, in a bounded pool of threads."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import PyDFlashError
from ..openai.completions import chat_prompt_tokens
from .anthropic import CountTokensRequest
from .base import Unsupported
from .http import error_response, json_response, read_json_object
from .native import pieces, tokenize_mixed
from .requests import check_conversation, describe, tools_bytes
from .responses import ResponsesRequest

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["native_routes"]

MAX_SMALL_BODY = 4 * 1024 * 1024  # text to tokenize or a conversation to template

# llama-server's endpoints of what pydflash does not do: (paths, methods, the feature)
_UNSUPPORTED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("/embedding", "/embeddings", "/v1/embeddings"), "POST", "embeddings"),
    (("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), "POST", "rerank"),
    (("/lora-adapters",), "GET", "LoRA adapters"),
    (("/lora-adapters",), "POST", "LoRA adapters"),
    (("/models/load", "/models/unload"), "POST", "the model router"),
    (("/v1/audio/transcriptions", "/audio/transcriptions"), "POST", "multimodal input (audio)"),
)


def native_routes(srv: ServerState) -> list[Route]:
    llm = srv.llm

    def endpoint(work: Callable[[dict[str, Any]], Any]) -> Callable[[Request], Awaitable[Response]]:
        return _endpoint(srv, work)

    def tokenize(body: dict[str, Any]) -> dict[str, Any]:
        content = body.get("content")
        if content is None:
            return {"tokens": []}
        tokens = tokenize_mixed(
            llm, content, bool(body.get("add_special", False)), bool(body.get("parse_special", True))
        )
        if body.get("with_pieces", False):
            return {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces(llm, tokens), strict=True)]}
        return {"tokens": tokens}

    def detokenize(body: dict[str, Any]) -> dict[str, Any]:
        tokens = body.get("tokens") or []
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ValueError("'tokens' must be a list of token ids")
        for t in tokens:
            if not 0 <= t < llm.n_vocab():
                raise ValueError(f"token id {t} is out of range [0, {llm.n_vocab()})")
        # the pieces joined, as llama-server's tokens_to_str (no clean-up of spaces)
        raw = b"".join(llm.core_model.token_pieces(tokens, True))
        return {"content": raw.decode("utf-8", "replace")}

    def template(body: dict[str, Any]) -> str:
        return _render(srv, body)

    def apply_template(body: dict[str, Any]) -> dict[str, Any]:
        return {"prompt": template(body)}

    def count_tokens(body: dict[str, Any]) -> dict[str, Any]:
        return CountTokensRequest.model_validate(body).count(llm, srv.limit.check)

    def response_tokens(body: dict[str, Any]) -> dict[str, Any]:
        req = ResponsesRequest.model_validate(body)
        srv.limit.check(req.prompt_bytes())
        prompt = llm.apply_chat_template(req.messages(), tools=req.chat().tools)
        return {"object": "response.input_tokens", "input_tokens": len(chat_prompt_tokens(llm, prompt))}

    def input_tokens(body: dict[str, Any]) -> dict[str, Any]:
        return {"input_tokens": len(tokenize_mixed(llm, template(body), True, True))}

    async def props(request: Request) -> Response:
        return json_response(srv.props())

    routes = [
        Route("/tokenize", endpoint(tokenize), methods=["POST"]),
        Route("/detokenize", endpoint(detokenize), methods=["POST"]),
        Route("/apply-template", endpoint(apply_template), methods=["POST"]),
        Route("/chat/completions/input_tokens", endpoint(input_tokens), methods=["POST"]),
        Route("/v1/chat/completions/input_tokens", endpoint(input_tokens), methods=["POST"]),
        Route("/v1/messages/count_tokens", endpoint(count_tokens), methods=["POST"]),
        Route("/v1/responses/input_tokens", endpoint(response_tokens), methods=["POST"]),
        Route("/responses/input_tokens", endpoint(response_tokens), methods=["POST"]),
        Route("/props", props, methods=["GET"]),
        Route("/props", _props_post, methods=["POST"]),
    ]
    for paths, method, feature in _UNSUPPORTED:
        routes += [Route(path, _refuse(feature), methods=[method]) for path in paths]
    return routes


def _render(srv: ServerState, body: dict[str, Any]) -> str:
    """/apply-template's prompt: the conversation bounded, then rendered."""
    llm = srv.llm
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("'tools' must be a list")
    # before the template renders them: the conversation's bounds and the prompt limit
    check_conversation(messages, tools)
    text = (m.get("content") for m in messages)
    n_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in text if isinstance(t, str))
    srv.limit.check(n_bytes + tools_bytes(tools))
    kwargs = dict(body.get("chat_template_kwargs") or {})
    add = kwargs.pop("add_generation_prompt", body.get("add_generation_prompt", True))
    if add and messages[-1].get("role") == "assistant" and body.get("continue_final_message"):
        raise ValueError("Cannot have both add_generation_prompt and continue_final_message")
    prompt = llm.apply_chat_template(
        messages,
        add_generation_prompt=bool(add),
        tools=tools,
        enable_thinking=bool(
            kwargs.pop("enable_thinking", body.get("enable_thinking", srv.defaults.get("enable_thinking", True)))
        ),
        **kwargs,
    )
    return prompt.prompt


def _endpoint(srv: ServerState, work: Callable[[dict[str, Any]], Any]) -> Callable[[Request], Awaitable[Response]]:
    """A JSON endpoint: the body read (capped, timed), ``work`` run in a thread, its errors as 400s."""

    async def handle(request: Request) -> Response:
        body = await read_json_object(request, MAX_SMALL_BODY, srv.timeout, empty_ok=True)
        if isinstance(body, Response):
            return body

        def reply() -> bytes:  # the JSON too is written off the event loop (/tokenize's pieces may be large)
            return json.dumps(work(body)).encode()

        try:
            return Response(
                await anyio.to_thread.run_sync(reply, limiter=srv.side_threads), media_type="application/json"
            )
        except ValidationError as e:
            return error_response(400, str(describe(e)))
        except Unsupported as e:
            return error_response(501, str(e))
        except (ValueError, TypeError, KeyError, PyDFlashError) as e:
            return error_response(400, str(e) if not isinstance(e, KeyError) else f"{e} is required")

    return handle


async def _props_post(request: Request) -> Response:
    msg = "This server does not support changing global properties. Start it with `--props`"
    return error_response(501, msg)


def _refuse(feature: str) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        return error_response(501, f"{feature} {'are' if feature.endswith('s') else 'is'} not supported by pydflash")

    return handle


def model_file(path: str) -> str:
    """A model's file name (its folder is not shown to clients)."""
    return os.path.basename(path)
