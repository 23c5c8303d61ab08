"""Regression tests of issue #48 part 2: no client can lock the others out, and
nothing is lost. Each case failed on the server before its fix. Real sockets to
a real server on 127.0.0.1 (the embedded pair, in this process); every test is
bounded in count and time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import pydflash
from pydflash import Llama
from pydflash.server import Server
from support.raw_http import Conn, body, completion, events, idle, metrics, poll


def get(srv: Server, path: str, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            data = r.read()
            return r.status, json.loads(data) if data[:1] in (b"{", b"[") else {"text": data.decode()}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post(srv: Server, path: str, data: bytes, headers: str = "") -> tuple[int, dict[str, str], dict]:
    with Conn(srv) as c:
        c.request("POST", path, data, headers="Content-Type: application/json\r\n" + headers)
        status, hdrs, res = c.response()
        return status, hdrs, json.loads(res)


@pytest.fixture(scope="module")
def one(embedded_dflash: Llama):
    """parallel 1, no queue, short timeouts: one stuck client would lock out everyone."""
    srv = Server(embedded_dflash, port=0, timeout=2, queue_size=0, max_connections=16).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def roomy(embedded_dflash: Llama):
    """A queue: requests sent one after the other never race the previous one's release."""
    srv = Server(embedded_dflash, port=0).start()
    yield srv
    srv.shutdown()


# -- 1. a client that stops reading -------------------------------------------------------

def test_a_client_that_stops_reading_is_cut_off(one):
    # a long stream of large chunks (20 logprobs each) to a client that reads nothing:
    # its buffers fill, the server cannot write; after --timeout it is cut off
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", one.port))
    data = completion(max_tokens=1000, stream=True, logprobs=20)
    stuck.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    try:
        poll(one, "the stream did not start", lambda m: m["pydflash_requests_processing"] == 1)
        deadline = time.monotonic() + 240  # the buffers fill after a hundred tokens or so
        while True:  # others get 503 while the stuck client holds the only place, then 200
            status, _, res = post(one, "/v1/completions", completion(max_tokens=2))
            if status == 200:
                break
            assert status == 503, res
            assert time.monotonic() < deadline, "a client that reads nothing locks the others out"
            time.sleep(0.5)
        assert res["usage"]["completion_tokens"] == 2
        assert metrics(one)["pydflash_requests_cancelled_total"] >= 1
    finally:
        stuck.close()
    idle(one)


# -- 2. admission once the body is whole ------------------------------------------------------

def test_partial_bodies_hold_no_place_in_the_queue(one):
    partial = [Conn(one) for _ in range(3)]
    try:
        for c in partial:  # each declares 100 bytes and sends 10
            c.send(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n" + completion()[:10])
        time.sleep(0.3)
        status, _, res = post(one, "/v1/completions", completion(max_tokens=2))
        assert status == 200, res
    finally:
        for c in partial:
            c.reset()


# -- 3. a prompt over the context -------------------------------------------------------------

@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_huge_prompt_is_refused_at_once(roomy, path):
    one = roomy
    text = "def f(x):\n    return x\n" * (8 * 1024 * 1024 // 24)  # 8 MB: ~3M tokens
    fields = {"prompt": text} if path == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    before = metrics(one)
    status, _, res = post(one, path, body(max_tokens=1, **fields))
    err = res["error"]
    assert status == 400 and err["type"] == "exceed_context_size_error", res
    assert err["n_ctx"] == one.llm.n_ctx_slot and err["n_prompt_tokens"] > err["n_ctx"]
    # refused before any of it was evaluated (the post's own timeout is the hang guard)
    after = metrics(one)
    assert after["pydflash_prompt_tokens_total"] == before["pydflash_prompt_tokens_total"], (before, after)
    assert after["pydflash_requests_processing"] == 0


def test_a_prompt_just_over_the_context_gives_its_exact_size(roomy):
    one = roomy
    tokens = one.llm.tokenize("def f(x):\n    return x\n" * 200)
    assert len(tokens) > one.llm.n_ctx_slot
    status, _, res = post(one, "/v1/completions", body(prompt=tokens, max_tokens=1))
    assert status == 400 and res["error"]["type"] == "exceed_context_size_error"
    assert res["error"]["n_prompt_tokens"] == len(tokens) and res["error"]["n_ctx"] == one.llm.n_ctx_slot


# -- 4. the stop list ------------------------------------------------------------------------

def test_the_stop_list_is_bounded(roomy):
    one = roomy
    status, _, res = post(one, "/v1/completions", completion(stop=[f"s{i}" for i in range(10_000)]))
    assert status == 400 and res["error"]["param"] == "stop" and "at most" in res["error"]["message"]
    status, _, res = post(one, "/v1/completions", completion(stop=["x" * 10_000]))
    assert status == 400 and res["error"]["param"] == "stop"
    status, _, res = post(one, "/v1/completions", completion(stop=[f"zz{i}" for i in range(16)]))
    assert status == 200 and res["usage"]["completion_tokens"] == 4


# -- 5. /slots during a long prefill ----------------------------------------------------------

def test_slots_do_not_block_the_event_loop(roomy):
    one = roomy
    prompt = one.llm.tokenize("def f(x):\n    return x\n" * 200)[: one.llm.n_ctx_slot - 8]
    done = threading.Event()

    def long_prefill() -> None:
        post(one, "/v1/completions", body(prompt=prompt, max_tokens=4, cache_prompt=False))
        done.set()

    threading.Thread(target=long_prefill, daemon=True).start()
    poll(one, "the prefill did not start", lambda m: m["pydflash_requests_processing"] == 1)
    answered: list[str] = []  # in the order the answers came (an order, not a clock)

    def slots_call() -> None:
        get(one, "/slots", timeout=120)
        answered.append("slots")

    key = 'pydflash_requests_total{endpoint="/slots"}'
    before = poll(one, "metrics", lambda m: True).get(key, 0.0)
    slots = threading.Thread(target=slots_call, daemon=True)
    slots.start()
    # /slots is in its handler (the server counted it) before /health is asked
    poll(one, "/slots did not arrive", lambda m: m.get(key, 0.0) > before)
    assert get(one, "/health")[0] == 200
    answered.append("health")
    slots.join(timeout=120)
    # /slots waits for the model's lock until the prefill's pass ends; /health does not wait for it
    assert answered == ["health", "slots"]
    assert done.wait(timeout=120)


# -- 6. graceful drain on SIGTERM ---------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_drains_and_ends_streams_well(sig, tmp_path):
    # the pydflash this test imported (site-packages, or src/ with a built _core)
    env = {**os.environ, "PYTHONPATH": str(Path(pydflash.__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        # a stream that outlasts the grace on a fast machine too (runs of plain steps make the
        # shipped pair's 2,000 tokens take under a second)
        [sys.executable, "-m", "pydflash", "serve", "--port", "0", "--n-ctx", "4096", "--shutdown-grace", "0.1"],
        stderr=subprocess.PIPE, env=env, text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "serving" not in line:
            line = proc.stderr.readline()
            assert line and time.monotonic() < deadline, "the server did not start"
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s, s.makefile("rb") as f:
            data = completion(max_tokens=4000, stream=True)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
            assert f.readline().split()[1] == b"200"
            while f.readline() not in (b"\r\n", b""):
                pass
            proc.send_signal(sig)
            raw = b""
            while size := int(f.readline().split(b";")[0], 16):  # chunked to its zero-size end
                raw += f.read(size)
                f.readline()
            f.readline()
        evs = events(raw)
        assert evs[-1]["error"]["type"] == "unavailable_error" and "shutting down" in evs[-1]["error"]["message"]
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


# -- 7. slot actions: body cap and timeout -------------------------------------------------------

@pytest.fixture(scope="module")
def slotted(embedded_dflash: Llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("slots")
    srv = Server(embedded_dflash, port=0, timeout=1, slot_save_path=path).start()
    yield srv
    srv.shutdown()


def test_slot_action_bodies_are_capped_and_timed(slotted):
    with Conn(slotted) as c:
        c.send(b"POST /slots/0?action=save HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 100000000\r\n\r\n{")
        status, _, res = c.response()
        assert status == 413 and json.loads(res)["error"]["code"] == 413
        assert c.closed(within=5)
    with Conn(slotted) as c:
        c.send(b"POST /slots/0?action=save HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: 100\r\n\r\n{\"filename\"")
        c.sock.settimeout(10)
        status, _, res = c.response()
        assert status == 408


# -- 8. API keys, Host, content types --------------------------------------------------------------

@pytest.fixture(scope="module")
def keyed(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0, api_keys=["k1", "k2"], cors_origins="http://good.example").start()
    yield srv
    srv.shutdown()


def test_api_key(keyed):
    assert get(keyed, "/health")[0] == 200 and get(keyed, "/v1/health")[0] == 200
    status, res = get(keyed, "/v1/models")
    assert status == 401 and res["error"] == {"message": "Invalid API Key", "type": "authentication_error",
                                               "param": None, "code": 401}
    assert get(keyed, "/v1/models", {"Authorization": "Bearer nope"})[0] == 401
    for near in ("k1x", "k", "k1k2"):  # a key is the whole of one: no prefix, no suffix
        assert get(keyed, "/v1/models", {"Authorization": f"Bearer {near}"})[0] == 401, near
        assert get(keyed, "/v1/models", {"x-api-key": near})[0] == 401, near
    assert get(keyed, "/v1/models", {"Authorization": "Bearer k2"})[0] == 200
    assert get(keyed, "/v1/models", {"x-api-key": "k1"})[0] == 200
    assert post(keyed, "/v1/completions", completion())[0] == 401
    assert post(keyed, "/v1/completions", completion(), "Authorization: Bearer k1\r\n")[0] == 200


def test_host_origin_and_content_type(keyed):
    auth = "Authorization: Bearer k1\r\n"
    with Conn(keyed) as c:  # a DNS-rebinding page: its own name in Host
        c.send(b"GET /v1/models HTTP/1.1\r\nHost: evil.example:8080\r\nAuthorization: Bearer k1\r\n\r\n")
        status, _, res = c.response()
        assert status == 403 and json.loads(res)["error"]["type"] == "permission_error"
    for host in ("localhost.evil.example", "127.0.0.1.evil.example:8080", "localhostx"):  # names, not prefixes
        with Conn(keyed) as c:
            c.send(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer k1\r\n\r\n".encode())
            assert c.response()[0] == 403, host
    with Conn(keyed) as c:  # a form post from a page: no JSON without a preflight
        c.request("POST", "/v1/completions", completion(), headers="Content-Type: text/plain\r\n" + auth)
        status, _, res = c.response()
        assert status == 415 and "JSON" in json.loads(res)["error"]["message"]
    status, _, res = post(keyed, "/v1/completions", completion(), auth + "Origin: http://evil.example\r\n")
    assert status == 403
    status, headers, res = post(keyed, "/v1/completions", completion(), auth + "Origin: http://good.example\r\n")
    assert status == 200 and headers["access-control-allow-origin"] == "http://good.example"
    with Conn(keyed) as c:  # the preflight needs no key
        c.send(b"OPTIONS /v1/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://good.example\r\n"
               b"Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n\r\n")
        status, headers, _ = c.response()
        assert status == 200 and headers["access-control-allow-origin"] == "http://good.example"
        assert "POST" in headers["access-control-allow-methods"]
    with Conn(keyed) as c:  # from an origin not allowed: no header, so the browser stops there
        c.send(b"OPTIONS /v1/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: http://evil.example\r\n"
               b"Access-Control-Request-Method: POST\r\n\r\n")
        status, headers, _ = c.response()
        assert status == 200 and "access-control-allow-origin" not in headers


# -- 9. slot erase while busy, NUL in a file name --------------------------------------------------

def test_a_busy_slot_is_a_503(slotted):
    # save, restore and erase of a slot a generation holds: SlotBusyError, 503
    with Conn(slotted) as running:
        running.request("POST", "/v1/completions", completion(max_tokens=1000, stream=True))
        assert running.head()[0] == 200
        for action, body in (("erase", b""), ("save", b'{"filename": "busy.bin"}'),
                             ("restore", b'{"filename": "busy.bin"}')):
            status, _, res = post(slotted, f"/slots/0?action={action}", body)
            assert status == 503 and res["error"]["type"] == "unavailable_error", (action, res)
            assert res["error"]["message"] == "slot 0 is busy", (action, res)
        running.reset()
    idle(slotted)


def test_a_nul_in_a_slot_file_name_is_a_400(slotted):
    before = set(os.listdir(slotted.slot_save_path))
    status, _, res = post(slotted, "/slots/0?action=save", json.dumps({"filename": "a\u0000b"}).encode())
    assert status == 400 and res["error"]["param"] == "filename"
    assert set(os.listdir(slotted.slot_save_path)) == before


# -- 10. the connection cap, HTTP/1.0 half-close, paths in messages ----------------------------------

def test_the_connection_cap_503_is_json(embedded_dflash):
    with Server(embedded_dflash, port=0, max_connections=2) as srv:
        conns = [Conn(srv) for _ in range(2)]
        time.sleep(0.2)
        try:
            with Conn(srv) as extra:
                extra.request("GET", "/health")
                status, headers, res = extra.response()
                assert status == 503 and headers["content-type"].startswith("application/json")
                assert json.loads(res)["error"]["type"] == "unavailable_error"
        finally:
            for c in conns:
                c.reset()


def test_no_100_continue_to_an_http_1_0_client(roomy):
    one = roomy
    data = completion()
    with Conn(one) as c:
        c.send(b"POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
        c.sock.shutdown(socket.SHUT_WR)
        first = c.f.readline()
        assert b" 100 " not in first, first
        assert b" 200 " in first


def test_error_messages_show_no_absolute_paths(slotted):
    status, _, res = post(slotted, "/slots/0?action=restore", body(filename="missing.bin"))
    msg = res["error"]["message"]
    assert status == 400 and "missing.bin" in msg
    assert str(slotted.slot_save_path) not in msg and "/" not in msg, msg


# -- issue #49: the README's /v1/ aliases ---------------------------------------------------------------

def test_v1_health_and_metrics(one):
    assert get(one, "/v1/health") == (200, {"status": "ok"})
    status, res = get(one, "/v1/metrics")
    assert status == 200 and "pydflash_requests_total" in res["text"]
