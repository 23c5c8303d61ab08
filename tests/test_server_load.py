"""Issue #48's load goal: 8 clients x 20 mixed requests (OpenAI completions and
chat, llama-server's native completion, streamed and whole) against one server:
no errors, and every output identical to the same request made alone, at
temperature 0. Bounded: 160 short requests."""

from __future__ import annotations

import json
import random
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from pydflash import Llama
from pydflash.server import Server
from support.raw_http import events

PROMPTS = ["def f(x):", "class A:\n    def", "import os\n", "for i in range(", "# sum of a list\ndef"]


def request(kind: str, prompt: str, stream: bool) -> tuple[str, dict]:
    common = {"temperature": 0, "ignore_eos": True, "stream": stream}
    if kind == "native":
        return "/completion", {"prompt": prompt, "n_predict": 6, **common}
    if kind == "chat":
        return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 6, **common}
    return "/v1/completions", {"prompt": prompt, "max_tokens": 6, **common}


def text_of(url: str, kind: str, prompt: str, stream: bool) -> str:
    path, data = request(kind, prompt, stream)
    req = urllib.request.Request(url + path, json.dumps(data).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200
        raw = r.read()
    if not stream:
        res = json.loads(raw)
        return res["content"] if kind == "native" else (
            res["choices"][0]["message"]["content"] if kind == "chat" else res["choices"][0]["text"])
    evs = [e for e in events(raw) if e != "[DONE]"]
    if kind == "native":
        return "".join(e["content"] for e in evs)
    if kind == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e["choices"])
    return "".join(e["choices"][0]["text"] for e in evs if e["choices"])


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama):
    with Server(embedded_dflash, port=0, queue_size=8) as srv:
        yield srv


def test_eight_clients_twenty_mixed_requests_each(server):
    rng = random.Random(48)
    jobs = [[(rng.choice(["native", "chat", "completion"]), rng.choice(PROMPTS), rng.random() < 0.5)
             for _ in range(20)] for _ in range(8)]
    alone = {key: text_of(server.url, *key) for key in {(k, p, False) for client in jobs for k, p, _ in client}}

    def client(work: list[tuple[str, str, bool]]) -> list[tuple[tuple[str, str, bool], str]]:
        return [((k, p, s), text_of(server.url, k, p, s)) for k, p, s in work]

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(client, jobs) for r in rs]
    assert len(results) == 160
    for (kind, prompt, stream), text in results:
        assert text == alone[(kind, prompt, False)], (kind, prompt, stream)
