"""Regression tests for defects found probing the standard-library server that
``pydflash serve`` was before Starlette + uvicorn. Each speaks raw HTTP/1.1 over
real sockets to a real server on 127.0.0.1 (the embedded pair, in this process,
so its log and stderr are this test's), and each failed on the old server.

1. kept-alive connections stay in step: a body left unread after an early
   answer is never parsed as the next request; conflicting framing is refused;
2. a failure after a stream started is an SSE error event, not a second HTTP
   response inside the stream; what can fail at the start fails before it;
3. deeply nested JSON is a 400;
4. a client that half-closes after its request still gets the answer;
5. idle connections, slow request heads and short bodies time out; connections
   are capped; admission is bounded (503);
6. clients that leave early leave no tracebacks;
7. tokenizing a huge prompt blocks no other request;
8. strict field types, add_generation_prompt, no pybind11 signatures in
   messages, tool_choice, no Python version in the Server header."""

from __future__ import annotations

import itertools
import json
import logging
import socket
import time
import urllib.request

import pytest

from pydflash import Llama
from pydflash.server.app import MAX_BODY, Server
from support.raw_http import Conn, body, completion, events, generations, idle, metrics, poll

MSGS = [{"role": "user", "content": "def f():"}]


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0).start()
    yield srv
    srv.shutdown()


# -- 1. kept-alive connections stay in step -----------------------------------------

SMUGGLED = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 37\r\n\r\n" + completion()[:37]


def test_unread_body_of_an_unknown_route_is_not_a_request(server):
    before = generations(server)
    with Conn(server) as c:
        c.request("POST", "/nope", SMUGGLED)
        c.request("GET", "/health")
        status, _, first = c.response()
        assert status == 404 and json.loads(first)["error"]["type"] == "not_found_error"
        assert c.response()[::2] == (200, b'{"status": "ok"}')  # the next answer is the next request's
    assert generations(server) == before


def test_a_body_over_the_limit_is_refused_unread(server):
    # the declared body starts with a complete request: it must not run
    before = generations(server)
    with Conn(server) as c:
        c.send(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode()
               + SMUGGLED)
        status, _, data = c.response()
        assert status == 413 and "over" in json.loads(data)["error"]["message"]
        assert c.closed(within=10)
    assert generations(server) == before


def test_a_chunked_body_is_read_as_the_body(server):
    data = completion()
    with Conn(server) as c:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (10, data[:10], len(data) - 10, data[10:]))
        status, _, res = c.response()
        assert status == 200 and json.loads(res)["usage"]["completion_tokens"] == 4
        c.request("GET", "/health")
        assert c.response()[::2] == (200, b'{"status": "ok"}')


@pytest.mark.parametrize("framing", ["two lengths", "chunked and a length"])
def test_ambiguous_framing_is_refused_and_the_connection_closed(server, framing):
    data = completion()
    head = f"Content-Length: {len(data)}\r\n" + (
        f"Content-Length: {len(data) + 5}\r\n" if framing == "two lengths" else "Transfer-Encoding: chunked\r\n")
    before = generations(server)
    with Conn(server) as c:
        c.send(f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + data)
        status, _, res = c.response()
        assert status == 400 and json.loads(res)["error"]["type"] == "invalid_request_error"
        assert c.closed(within=10)
    assert generations(server) == before


# -- 2. errors around a stream's start ----------------------------------------------

def test_a_failure_after_the_stream_started_is_an_error_event(server, embedded_dflash):
    with Conn(server) as c:
        c.request("POST", "/v1/completions", completion(max_tokens=1000, stream=True))
        status, headers = c.head()
        assert status == 200
        chunked = headers.get("transfer-encoding") == "chunked"
        body = c.chunks() if chunked else iter(lambda: c.f.read1(1 << 16), b"")  # else: to the close
        assert next(body).startswith(b"data: ")  # the first event: the generation runs
        embedded_dflash.interrupt()  # and fails
        rest = b"".join(body)  # to the stream's end
        assert b"HTTP/1.1" not in rest  # no second response inside the stream
        assert events(rest)[-1]["error"]["code"] == 500 and "interrupted" in events(rest)[-1]["error"]["message"]
        assert "[DONE]" not in events(rest)
        assert chunked  # the stream ended cleanly: the connection serves on
        c.request("GET", "/health")
        assert c.response()[::2] == (200, b'{"status": "ok"}')
    idle(server)


@pytest.mark.parametrize("field, match", [
    (dict(logit_bias={"99999": 1}), "logit_bias"),
    (dict(prompt="x " * 1100), "context"),
    (dict(top_k=2**31), "top_k"),
], ids=["logit_bias id", "prompt over n_ctx", "top_k over 32 bits"])
def test_what_fails_at_the_start_of_a_stream_is_a_400(server, field, match):
    with Conn(server) as c:
        c.request("POST", "/v1/completions", completion(stream=True, echo=True, **field))
        status, _, res = c.response()
        assert status == 400 and match in json.loads(res)["error"]["message"]


# -- 3. deep JSON ----------------------------------------------------------------

def test_deeply_nested_json_is_a_400(server):
    with Conn(server) as c:
        c.request("POST", "/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        status, _, res = c.response()
        assert status == 400 and "nested too deeply" in json.loads(res)["error"]["message"]


# -- 4. half-close -----------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_client_gets_its_answer(server, stream):
    with Conn(server) as c:
        c.request("POST", "/v1/completions", completion(stream=stream))
        c.sock.shutdown(socket.SHUT_WR)  # as nc -N does after the request
        status, _, res = c.response()
        assert status == 200
        if stream:
            assert events(res)[-1] == "[DONE]" and events(res)[-2]["usage"]["completion_tokens"] == 4
        else:
            assert json.loads(res)["usage"]["completion_tokens"] == 4


# -- 5. timeouts and limits --------------------------------------------------------

@pytest.fixture(scope="module")
def strict(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0, timeout=1, timeout_keep_alive=1, max_connections=4, queue_size=0).start()
    yield srv
    srv.shutdown()


def test_idle_and_slow_connections_are_closed(strict):
    with Conn(strict) as silent, Conn(strict) as slow, Conn(strict) as done:
        done.request("GET", "/health")
        assert done.response()[0] == 200
        with pytest.raises(OSError):  # a broken pipe: the server closed the connection
            # a head that never ends, a byte at a time: 400 of them outlast the 1 s timeout many times
            for byte in itertools.islice(itertools.cycle(b"GET /health HTTP/1.1\r\nX: 1\r\n"), 400):
                slow.send(bytes([byte]))
                time.sleep(0.05)
            pytest.fail("a slow request head holds the connection")
        assert silent.closed(within=5)  # connected, never sent anything
        assert done.closed(within=5)  # kept alive after its answer, then idle


def test_a_short_body_times_out(strict):
    with Conn(strict) as c:
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n" + completion()[:10])
        c.sock.settimeout(10)
        status, _, res = c.response()
        assert status == 408 and "within 1 s" in json.loads(res)["error"]["message"]
        assert c.closed(within=5)


def test_connections_are_capped(strict):
    conns = [Conn(strict) for _ in range(4)]
    time.sleep(0.2)  # all accepted
    try:
        with Conn(strict) as extra:
            extra.request("GET", "/health")
            assert extra.response()[0] == 503
    finally:
        for c in conns:
            c.reset()


def test_admission_is_bounded(strict):
    # parallel 1 + queue 0: while one generation runs, the next request is refused
    with Conn(strict) as running:
        running.request("POST", "/v1/completions", completion(max_tokens=1000, stream=True))
        assert running.head()[0] == 200
        with Conn(strict) as refused:
            refused.request("POST", "/v1/completions", completion())
            status, headers, res = refused.response()
            assert status == 503 and headers["retry-after"] == "1"
            assert json.loads(res)["error"]["type"] == "unavailable_error"
        assert metrics(strict)["pydflash_requests_rejected_total"] >= 1
        running.reset()
    idle(strict)


# -- 6. clients that leave early -----------------------------------------------------

def test_clients_that_leave_early_leave_no_tracebacks(server, capfd, caplog):
    caplog.set_level(logging.WARNING)
    with Conn(server) as c:  # inside the request line
        c.send(b"POST /v1/compl")
        time.sleep(0.2)
        c.reset()
    with Conn(server) as c:  # inside the body
        c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n{")
        time.sleep(0.2)
        c.reset()
    for stream in (True, False):  # during a generation
        before = metrics(server)
        with Conn(server) as c:
            c.request("POST", "/v1/completions", completion(max_tokens=1000, stream=stream))
            poll(server, "the generation did not start", lambda m: m["pydflash_requests_processing"] == 1)
            c.reset()
        poll(server, "not cancelled", lambda m, b=before: m["pydflash_requests_cancelled_total"]
             > b["pydflash_requests_cancelled_total"])
    with Conn(server) as c:  # before its answer is read
        c.request("GET", "/v1/models")
        c.reset()
    idle(server)
    time.sleep(0.5)
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text


def test_a_disconnect_cancels_its_own_generation_only(server):
    # A streams a long generation; B waits behind it; A's client leaves: B is answered in full
    with Conn(server) as a, Conn(server) as b:
        a.request("POST", "/v1/completions", completion(max_tokens=1000, stream=True))
        poll(server, "A did not start", lambda m: m["pydflash_requests_processing"] == 1)
        b.request("POST", "/v1/completions", completion(max_tokens=8))
        poll(server, "B was not queued", lambda m: m["pydflash_requests_deferred"] == 1)
        a.reset()
        status, _, res = b.response()
        assert status == 200 and json.loads(res)["usage"]["completion_tokens"] == 8
    idle(server)


# -- 7. a huge prompt -----------------------------------------------------------------

def test_a_huge_prompt_blocks_no_other_request(server, monkeypatch):
    # a prompt far over the context is refused before it is tokenized (issue #48), while
    # /health and a small generation are answered as usual
    unit = "    def __init__(self):\n        return\n"  # ~4 characters a token: 7M tokens
    data = body(prompt=unit * ((MAX_BODY - 1024) // len(json.dumps(unit))), max_tokens=1)
    assert len(data) <= MAX_BODY
    tokenized: list[int] = []  # prompts the server tokenized (a counter, not a clock)
    tokens = server.llm.prompt_tokens
    monkeypatch.setattr(server.llm, "prompt_tokens", lambda *a, **k: tokenized.append(1) or tokens(*a, **k))
    with Conn(server) as c:
        c.request("POST", "/v1/completions", data)
        status, _, res = c.response()
        assert status == 400 and "context" in json.loads(res)["error"]["message"]
    assert tokenized == []
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        assert r.status == 200
    with Conn(server) as c:
        c.request("POST", "/v1/completions", completion(max_tokens=2))
        status, _, res = c.response()
        assert status == 200 and json.loads(res)["usage"]["completion_tokens"] == 2


# -- 8. fields, messages, headers ---------------------------------------------------------

def post(srv: Server, path: str, data: bytes) -> tuple[int, dict[str, str], dict]:
    with Conn(srv) as c:
        c.request("POST", path, data)
        status, headers, res = c.response()
        return status, headers, json.loads(res)


def test_field_types_are_strict(server):
    status, _, res = post(server, "/v1/completions", completion(stream="false"))
    assert status == 400 and res["error"]["message"] == "'stream' must be bool" and res["error"]["param"] == "stream"


def test_add_generation_prompt_in_chat_template_kwargs(server):
    chat = dict(messages=MSGS, max_tokens=2, temperature=0)
    status, _, on = post(server, "/v1/chat/completions", body(**chat))
    assert status == 200
    status, _, off = post(server, "/v1/chat/completions",
                          body(**chat, chat_template_kwargs={"add_generation_prompt": False}))
    assert status == 200, off
    assert off["usage"]["prompt_tokens"] < on["usage"]["prompt_tokens"]  # no assistant header


@pytest.mark.parametrize("path, fields", [
    ("/v1/completions", {"prompt": "a\\ud800b"}),
    ("/v1/completions", {"prompt": "x", "grammar": 'root ::= "\\udc00"'}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\\ud800"}]}),
], ids=["prompt", "grammar", "message"])
def test_400_messages_show_no_binding_signatures(server, path, fields):
    raw = json.dumps(fields).replace("\\\\u", "\\u").encode()  # a lone surrogate, as JSON escapes it
    status, _, res = post(server, path, raw)
    msg = res["error"]["message"]
    assert status == 400, res
    for leak in ("incompatible function arguments", "Invoked with", "_core", "->"):
        assert leak not in msg, msg


@pytest.mark.parametrize("choice, ok", [
    ("auto", True), ("none", True), ("required", True), ({"type": "function", "function": {"name": "f"}}, True),
    ("sometimes", False), ({"type": "function", "function": {"name": "g"}}, False),
], ids=["auto", "none", "required", "a function", "unknown", "a function not offered"])
def test_tool_choice(server, choice, ok):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    status, _, res = post(server, "/v1/chat/completions",
                          body(messages=MSGS, max_tokens=2, tools=tools, tool_choice=choice))
    if ok:
        assert status == 200, res
    else:
        assert status == 400 and json.dumps(choice) in res["error"]["message"]
        assert res["error"]["param"] == "tool_choice"


def test_a_chat_stream_opens_with_llama_servers_first_delta(server):
    # llama-server's {"role": "assistant", "content": null}; the Python API sends the role alone
    req = urllib.request.Request(server.url + "/v1/chat/completions",
                                 body(messages=MSGS, max_tokens=3, temperature=0, stream=True),
                                 {"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=300) as r:
        evs = events(r.read())
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert all("role" not in e["choices"][0]["delta"] for e in evs[1:-1] if e["choices"])


def test_the_server_header_names_no_versions(server):
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        assert r.headers["Server"] == "pydflash"
