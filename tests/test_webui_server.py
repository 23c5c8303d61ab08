"""The chat page's server side, without a browser: ``GET /`` and the page's files (no key
needed, a policy that runs only the page's own scripts, ETags), ``--no-webui``, the
model card's fields in ``/props``, and the per-chunk ``speculative`` object that streams
with ``timings_per_token``: each token's text and how it was made, each target pass,
consistent with the reply's ``timings`` and with ``/metrics``."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import pydflash
from pydflash import Llama
from pydflash.server import Server
from support.http import get, serve

T1 = 1  # threads: these tests are not about threads


@pytest.fixture(scope="module")
def llm():
    target, drafter = pydflash.embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024, n_threads=T1) as llm:
        yield llm


@pytest.fixture(scope="module")
def keyed(llm):
    with Server(llm, port=0, api_keys=["sesame"], metrics=True) as srv:
        yield srv.url


def _get(url: str, headers: dict | None = None) -> tuple[int, Any, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def _stream(url: str, body: dict, key: str = "sesame") -> list[dict]:
    req = urllib.request.Request(url + body.pop("path", "/v1/chat/completions"), json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=300) as r:
        lines = r.read().decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: {")]


def test_the_page_and_its_files_need_no_key_and_run_only_their_own_scripts(keyed):
    status, headers, html = _get(keyed + "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "'unsafe-inline'" not in csp
    assert headers["x-content-type-options"] == "nosniff"
    files = re.findall(r'(?:src|href)="(/webui/[^"]+)"', html.decode())
    assert "/webui/app.js" in files and "/webui/style.css" in files
    # the modules the page imports, as the browser finds them
    for name in re.findall(r'from "\./([a-z]+\.js)"', _get(keyed + "/webui/app.js")[2].decode()):
        files.append("/webui/" + name)
    assert len(set(files)) >= 4
    for path in set(files):
        status, headers, body = _get(keyed + path)
        assert status == 200 and body, path
        want = "text/css" if path.endswith(".css") else "text/javascript"
        assert headers["content-type"].startswith(want), path
        # unchanged: 304, with no body
        assert _get(keyed + path, {"If-None-Match": headers["etag"]})[0] == 304
    assert _get(keyed + "/webui/missing.js")[0] == 401  # not one of the page's files: the key is needed
    assert _get(keyed + "/props")[0] == 401


def test_props_has_the_model_card(keyed, llm):
    status, _, body = _get(keyed + "/props", {"Authorization": "Bearer sesame"})
    props = json.loads(body)
    assert status == 200 and props["ui"] is True
    assert props["pair"] == {"drafter_kind": "dflash", "drafter": llm.pair.drafter_description,
                             "block_size": llm.pair.block_size, "rollback": "kv-trim"}
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == llm.n_ctx_slot


def test_no_webui_turns_the_page_off():
    with serve("--no-webui", "-t", "1", "-c", "512") as url:
        assert get(url + "/")[0] == 404
        assert get(url + "/webui/app.js")[0] == 404
        assert json.loads(get(url + "/props")[1])["ui"] is False
    with serve("-t", "1", "-c", "512") as url:  # on by default
        assert get(url + "/")[0] == 200


def _joined(chunks: list[dict]) -> tuple[str, list[str], str, list[dict]]:
    text, tokens, kinds, passes = "", [], "", []
    for c in chunks:
        for choice in c["choices"]:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
        spec = c.get("speculative")
        if spec is not None:
            tokens += spec["tokens"]
            kinds += spec["kinds"]
            passes += spec["passes"]
    return text, tokens, kinds, passes


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_each_chunk_says_how_its_tokens_were_made(keyed, path):
    before = metrics_with_key(keyed)
    body = {"path": path, "max_tokens": 40, "temperature": 0, "stream": True, "timings_per_token": True,
            "draft_max": 5, "ignore_eos": True}
    body.update({"messages": [{"role": "user", "content": "def fib(n):"}]} if "chat" in path
                else {"prompt": "class Stack:\n    def __init__(self):\n"})
    chunks = _stream(keyed, body)
    text, tokens, kinds, passes = _joined(chunks)
    last = chunks[-1]
    tm, final = last["timings"], last["speculative"]
    # every chunk of text carries its speculative object; only the last has the totals
    assert all("speculative" in c for c in chunks if "timings" in c)
    assert all("accepted_lengths" not in c["speculative"] for c in chunks[:-1] if "speculative" in c)
    # the tokens spell the reply, one kind each, as many as the reply has
    assert "".join(tokens) == text and len(kinds) == len(tokens) == tm["predicted_n"] == 40
    assert len(passes) == tm["n_steps"] == len(final["accepted_lengths"])
    assert [p["n_accepted"] for p in passes] == final["accepted_lengths"]
    assert sum(p["n_drafted"] for p in passes) == tm["draft_n"]
    # each pass: its accepted drafts, then the target's own token
    assert kinds == "".join("d" * p["n_accepted"] + "t" for p in passes)[: len(kinds)]
    assert kinds.count("d") == tm["draft_n_accepted"] > 0  # the embedded pair's drafts are accepted
    assert all(0 <= p["draft_max"] <= 5 and p["source"] in ("", "draft-dflash") for p in passes)
    # counted once in /metrics, though every chunk has timings and speculative
    after = metrics_with_key(keyed)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 40
    assert after["pydflash_target_passes_total"] - before["pydflash_target_passes_total"] == len(passes)


def metrics_with_key(url: str) -> dict[str, float]:
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer sesame"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln and ln[0] != "#")}


def test_a_stop_string_cuts_the_text_and_the_tokens_alike(keyed):
    chunks = _stream(keyed, {"path": "/v1/completions", "prompt": "def f(x):\n", "stop": ["return", "\n\n"],
                             "max_tokens": 60, "temperature": 0, "stream": True, "timings_per_token": True})
    text, tokens, kinds, passes = _joined(chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # a token that straddles the stop string is dropped; the text before the stop stays
    assert text.startswith("".join(tokens)) and len(text) - len("".join(tokens)) < 16
    assert len(kinds) == len(tokens) == chunks[-1]["timings"]["predicted_n"]


def test_include_usage_and_plain_streams_keep_their_shapes(keyed):
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0, "stream": True}
    chunks = _stream(keyed, {**base, "timings_per_token": True, "stream_options": {"include_usage": True}})
    tail = chunks[-1]
    assert tail["choices"] == [] and "accepted_lengths" in tail["speculative"] and "usage" in tail
    assert "".join(_joined(chunks)[1]) == _joined(chunks)[0]
    # without timings_per_token: the last chunk's speculative alone, as before
    plain = _stream(keyed, dict(base))
    assert [sorted(c["speculative"]) for c in plain if "speculative" in c] == [["accepted_lengths", "draft_sources"]]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the server's end of a connection in /proc (Linux)")
def test_the_server_sends_small_writes_at_once(llm):
    # TCP_NODELAY on accepted connections: else a stream's first chunk after its head waits for
    # a keep-alive client's delayed ACK (40 ms; the chat page's first token showed it)
    with Server(llm, port=0) as srv, socket.create_connection(("127.0.0.1", srv.port)) as client:
        client.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")  # accepted and answered: the server holds its end
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                end = socket.socket(fileno=os.dup(int(fd)))
            except OSError:  # not a socket
                continue
            with end:
                try:
                    if end.type == socket.SOCK_STREAM and end.getpeername() == client.getsockname():
                        found.append(end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                except OSError:  # not connected, or not TCP
                    pass
        assert found == [1]
