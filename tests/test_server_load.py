"""Issue #48's load goal: 8 clients x 20 mixed requests (OpenAI completions and
chat, llama-server's native completion, streamed and whole; Anthropic messages)
against one server: no errors, and every output identical to the same request
made alone, at temperature 0. Issue #63's: the same with one client of the eight
sending only hostile requests (each refused with its 4xx), and the process's
resident memory back within 10% of where it started. Bounded: 160 short requests."""

from __future__ import annotations

import gc
import json
import os
import random
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from pydflash import Llama
from pydflash.server import Server
from pydflash.server.requests import MAX_MESSAGES, MAX_PROBS, MAX_PROMPTS
from pydflash.server.streams import MAX_LOOKUP_IDS
from support.raw_http import events

PROMPTS = ["def f(x):", "class A:\n    def", "import os\n", "for i in range(", "# sum of a list\ndef"]


def request(kind: str, prompt: str, stream: bool) -> tuple[str, dict]:
    common = {"temperature": 0, "ignore_eos": True, "stream": stream}
    if kind == "native":
        return "/completion", {"prompt": prompt, "n_predict": 6, **common}
    messages = [{"role": "user", "content": prompt}]
    if kind == "chat":
        return "/v1/chat/completions", {"messages": messages, "max_tokens": 6, **common}
    if kind == "anthropic":
        return "/v1/messages", {"messages": messages, "max_tokens": 6, **common}
    return "/v1/completions", {"prompt": prompt, "max_tokens": 6, **common}


def text_of(url: str, kind: str, prompt: str, stream: bool) -> str:
    path, data = request(kind, prompt, stream)
    req = urllib.request.Request(url + path, json.dumps(data).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200
        raw = r.read()
    if not stream:
        res = json.loads(raw)
        if kind == "anthropic":
            return "".join(b["text"] for b in res["content"] if b["type"] == "text")
        return (
            res["content"]
            if kind == "native"
            else (res["choices"][0]["message"]["content"] if kind == "chat" else res["choices"][0]["text"])
        )
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


def mixed_jobs(seed: int, n_clients: int) -> list[list[tuple[str, str, bool]]]:
    """Each client's 20 requests: (kind, prompt, streamed); Anthropic's only whole."""
    rng = random.Random(seed)
    jobs = [
        [
            (rng.choice(["native", "chat", "completion", "anthropic"]), rng.choice(PROMPTS), rng.random() < 0.5)
            for _ in range(20)
        ]
        for _ in range(n_clients)
    ]
    return [[(k, p, s and k != "anthropic") for k, p, s in client] for client in jobs]


def run_clients(url: str, jobs: list[list[tuple[str, str, bool]]], hostile: int = 0) -> list[tuple[tuple, str]]:
    """Every client's requests at once, each client in turn; ``hostile`` clients more, each
    sending HOSTILE's requests in turn (each checked for its 4xx)."""

    def client(work: list[tuple[str, str, bool]]) -> list[tuple[tuple, str]]:
        return [((k, p, s), text_of(url, k, p, s)) for k, p, s in work]

    def attacker(_: int) -> list[tuple[tuple, str]]:
        for i in range(20):
            refused(url, *HOSTILE[i % len(HOSTILE)])
        return []

    with ThreadPoolExecutor(len(jobs) + hostile) as pool:
        futures = [pool.submit(client, work) for work in jobs] + [pool.submit(attacker, i) for i in range(hostile)]
        return [r for f in futures for r in f.result()]


def test_eight_clients_twenty_mixed_requests_each(server):
    jobs = mixed_jobs(48, 8)
    alone = {key: text_of(server.url, *key) for key in {(k, p, False) for client in jobs for k, p, _ in client}}
    results = run_clients(server.url, jobs)
    assert len(results) == 160
    for (kind, prompt, stream), text in results:
        assert text == alone[(kind, prompt, False)], (kind, prompt, stream)


# issue #63's hostile cases, each quick to refuse: (method, path, body, headers, status)
MESSAGES = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
HOSTILE: list[tuple[str, str, bytes, dict[str, str], int]] = [
    ("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}, status)
    for path, body, status in [
        (
            "/completion",
            {"prompt": "x", "n_predict": 1, "grammar": "root ::= " + "(" * 20000 + '"a"' + ")" * 20000},
            400,
        ),
        ("/v1/completions", {"prompt": "x", "max_tokens": 1, "grammar": "root ::= " + '"a"{0,1999} ' * 1000}, 400),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": 'root ::= "a"{5,2}'}, 400),
        ("/completion", {"prompt": "x", "n_predict": 1, "grammar": "root ::= " + '"a"? ' * 1000 + '"b"'}, 400),
        ("/completion", {"prompt": "x", "n_predict": 1, "n_probs": 4096}, 400),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": MAX_PROBS + 1, "logprobs": True},
            400,
        ),
        ("/v1/chat/completions", {"messages": MESSAGES}, 400),
        ("/v1/messages/count_tokens", {"messages": MESSAGES}, 400),
        ("/completion", {"prompt": ["x"] * (MAX_PROMPTS + 1), "n_predict": 1}, 400),
        ("/v1/streams/lookup", {"conversation_ids": [f"c{i}" for i in range(MAX_LOOKUP_IDS + 1)]}, 400),
        ("/apply-template", {"messages": ["x"]}, 400),
    ]
] + [
    ("POST", "/completion", b'{"prompt": "x", "n_predict": 1}', {"Origin": "https://evil.example"}, 415),
    ("GET", "/v1/stream?conv_id=nobody&from=%C2%B2", b"", {}, 404),  # no such stream, before "from"
]


def refused(url: str, method: str, path: str, body: bytes, headers: dict[str, str], status: int) -> None:
    req = urllib.request.Request(url + path, body or None, headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            got = r.status
    except urllib.error.HTTPError as e:
        got = e.code
    assert got == status, (method, path, got)


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_one_hostile_client_among_eight_costs_the_others_nothing(server):
    jobs = mixed_jobs(63, 7)
    alone = {key: text_of(server.url, *key) for key in {(k, p, False) for client in jobs for k, p, _ in client}}
    for case in HOSTILE:  # once each, so that what a first refusal allocates for good is counted before
        refused(server.url, *case)
    gc.collect()
    start = rss_mib()
    results = run_clients(server.url, jobs, hostile=1)
    assert len(results) == 140  # nothing lost
    for (kind, prompt, stream), text in results:
        assert text == alone[(kind, prompt, False)], (kind, prompt, stream)
    gc.collect()
    assert rss_mib() < start * 1.1, (start, rss_mib())
