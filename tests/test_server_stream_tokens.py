"""The native ``/completion`` stream sends one event per token, as llama-server does
(issue #65), speculative step or not: each event's ``completion_probabilities`` is its
own token's, its ``timings`` count that token. Checked on the shipped pair with a pinned
draft length (steps of several tokens), and against llama-server's stream for the same
request where ``tools/build_native.py --target llama-server`` has built it."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import pydflash
from pydflash import Llama
from pydflash.bench.engines import find_llama_server
from pydflash.server import Server
from support.raw_http import events

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "build" / "native" / "bin" / "llama-server"  # tools/build_native.py
LLAMA_SERVER = str(BUILT) if BUILT.is_file() else find_llama_server(None)
REQUEST = {"prompt": "def f(x):", "n_predict": 24, "n_probs": 10, "temperature": 0.0, "stream": True}


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0).start()
    yield srv
    srv.shutdown()


def post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.read()


def test_one_event_per_token_with_its_own_probs_and_timings(server):
    body = dict(REQUEST, **{"speculative.n_max": 4, "timings_per_token": True})
    evs = events(post(server.url, body))
    *chunks, final = evs
    assert final["stop"] is True and final["timings"]["predicted_n"] == 24
    # several tokens came out of one verification pass: the split is the server's, not the steps'
    assert max(final["speculative"]["accepted_lengths"]) > 0
    assert len(chunks) == 24
    for i, e in enumerate(chunks, start=1):
        assert e["stop"] is False and len(e["tokens"]) == 1
        (p,) = e["completion_probabilities"]
        assert p["id"] == e["tokens"][0] and len(p["top_logprobs"]) == 10
        assert e["tokens_predicted"] == i and e["timings"]["predicted_n"] == i
    whole = json.loads(post(server.url, dict(body, stream=False)))
    assert "".join(e["content"] for e in chunks) == whole["content"]
    assert [e["completion_probabilities"][0] for e in chunks] == whole["completion_probabilities"]


def test_a_stop_string_holds_text_back_but_not_the_token_events(server):
    # "representation" may begin the stop string: its token's event holds it back
    stop = {"stop": ["representation of"], "n_predict": 48}
    *chunks, final = events(post(server.url, dict(REQUEST, **stop)))
    assert all(len(e["tokens"]) == 1 and len(e["completion_probabilities"]) == 1 for e in chunks)
    assert chunks[-1]["content"] == " " and chunks[-1]["completion_probabilities"][0]["token"] == " representation"
    text = "".join(e["content"] for e in chunks)
    assert final["stop_type"] == "word" and text.endswith("Return a string ")
    assert text == json.loads(post(server.url, dict(REQUEST, stream=False, **stop)))["content"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server():
    if LLAMA_SERVER is None:
        pytest.skip("llama-server is not built (python tools/build_native.py --target llama-server)")
    target, _ = pydflash.embedded_pair()
    port = _free_port()
    cmd = [LLAMA_SERVER, "-m", target, "--port", str(port), "-c", "1024", "-np", "1", "-t", "1", "--no-webui"]
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):  # up to a minute for the model to load
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, "llama-server exited"
            time.sleep(0.1)
        yield url
        proc.terminate()


def test_the_stream_matches_llama_servers_event_for_event(server, llama_server):
    ours = events(post(server.url, REQUEST))
    theirs = events(post(llama_server, REQUEST))
    assert len(ours) == len(theirs) == REQUEST["n_predict"] + 1
    for mine, other in zip(ours[:-1], theirs[:-1], strict=True):
        assert set(other) <= set(mine)  # llama-server's fields, each one there
        assert (mine["content"], mine["tokens"], mine["tokens_predicted"]) == (
            other["content"],
            other["tokens"],
            other["tokens_predicted"],
        )
        (p,), (q,) = mine["completion_probabilities"], other["completion_probabilities"]
        assert p["id"] == q["id"] and [t["id"] for t in p["top_logprobs"]] == [t["id"] for t in q["top_logprobs"]]
    assert ours[-1]["stop"] is theirs[-1]["stop"] is True
