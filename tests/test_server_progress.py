"""llama-server's ``return_progress``: a stream asked for it gets a ``prompt_progress``
event when its prompt starts (``processed`` == ``cache``) and after each chunk the
engine evaluates (``processed`` rising to ``total``), before any token; ``total``,
``cache``, ``processed`` and ``time_ms`` as in tools/server/server-context.cpp
(``send_partial_response``). Without it, or without ``stream``, there is none. A tiny
pair with 64-token prefill chunks, served in this process."""

from __future__ import annotations

import itertools
import json
import urllib.request
from pathlib import Path

import pytest

from pydflash import Llama
from pydflash.server import Server

N_BATCH = 64
PROMPT = list(range(1, 201))  # 200 tokens: several chunks
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(model_dir: Path, target_path: Path):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=512, n_batch=N_BATCH) as llm:
        srv = Server(llm, port=0).start()
        yield srv
        srv.shutdown()


def stream(srv: Server, path: str, data: dict) -> list[dict]:
    req = urllib.request.Request(
        srv.url + path, json.dumps({**data, "stream": True}).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def check_progress(chunks: list[dict], n_prompt: int, n_cached: int = 0) -> list[dict]:
    """The llama-server test's invariants (tests/unit/test_chat_completion.py, test_return_progress)."""
    at = [i for i, c in enumerate(chunks) if "prompt_progress" in c]
    events = [chunks[i]["prompt_progress"] for i in at]
    assert at == list(range(len(at))), "progress comes first, before any token"
    assert set(events[0]) == {"total", "cache", "processed", "time_ms"}
    assert events[0]["cache"] == events[0]["processed"] == n_cached
    assert all(e["total"] == n_prompt and e["cache"] == n_cached for e in events)
    steps = [b["processed"] - a["processed"] for a, b in itertools.pairwise(events)]
    assert all(0 < s <= N_BATCH for s in steps), steps  # one event per chunk
    assert events[-1]["processed"] == n_prompt
    assert len(events) >= 1 + (n_prompt - n_cached - 1) // N_BATCH
    assert all(isinstance(e["time_ms"], int) and e["time_ms"] >= 0 for e in events)
    assert [e["time_ms"] for e in events] == sorted(e["time_ms"] for e in events)
    return events


def test_native_completion(server):
    chunks = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 4, "return_progress": True, **GREEDY})
    events = check_progress(chunks, len(PROMPT))
    first = chunks[0]
    assert first["content"] == "" and first["stop"] is False and first["tokens_predicted"] == 0
    assert first["tokens_evaluated"] == len(PROMPT)
    rest = chunks[len(events) :]
    assert sum(len(c["tokens"]) for c in rest) == 4 and rest[-1]["stop"] is True
    # a prompt the cache holds: its first event says so
    again = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 4, "return_progress": True, **GREEDY})
    cached = again[0]["prompt_progress"]["cache"]
    assert cached > 0
    check_progress(again, len(PROMPT), cached)


def test_without_return_progress_there_is_none(server):
    chunks = stream(server, "/completion", {"prompt": PROMPT, "n_predict": 2, "cache_prompt": False, **GREEDY})
    assert not any("prompt_progress" in c for c in chunks)
    req = urllib.request.Request(
        server.url + "/completion",
        json.dumps({"prompt": PROMPT, "n_predict": 2, "return_progress": True, **GREEDY}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        assert "prompt_progress" not in json.loads(r.read())  # a stream's events only


def test_openai_completions(server):
    body = {"prompt": PROMPT, "max_tokens": 3, "return_progress": True, "cache_prompt": False, **GREEDY}
    chunks = stream(server, "/v1/completions", body)
    events = check_progress(chunks, len(PROMPT))
    for c in chunks[: len(events)]:
        assert c["object"] == "text_completion" and c["choices"][0]["text"] == ""
        assert c["choices"][0]["finish_reason"] is None
    assert "".join(c["choices"][0]["text"] for c in chunks[len(events) :])


def test_chat_completions(server):
    msgs = [{"role": "user", "content": "x " * 150}]
    body = {"messages": msgs, "max_tokens": 3, "return_progress": True, "cache_prompt": False, **GREEDY}
    chunks = stream(server, "/v1/chat/completions", body)
    n_prompt = chunks[-1]["usage"]["prompt_tokens"]
    events = check_progress(chunks, n_prompt)
    for c in chunks[: len(events)]:  # llama-server's progress delta: the role, no content
        assert c["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[len(events)]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert not any("prompt_progress" in c for c in chunks[len(events) :])


def test_responses(server):
    body = {"input": "x " * 150, "max_output_tokens": 3, "return_progress": True, **GREEDY}
    events = stream(server, "/v1/responses", body)
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[0]["prompt_progress"]["processed"] == progress[0]["prompt_progress"]["cache"]
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    plain = stream(server, "/v1/responses", {**body, "return_progress": False})
    assert not any("prompt_progress" in e for e in plain)
