"""Requests a hostile client sends (issue #63's probe) against a real server on 127.0.0.1:
each is refused before any work with a 4xx that names the limit, never a 500 or a dead
process, and the server answers the next request. Each failed before its fix:

1-2. grammars and JSON schemas over a limit (deep groups killed the process; the
     repetition bomb and {5,2} froze it);
3.   n_probs / logprobs / top_logprobs over 20 (4,096 made a 64 MB reply);
4.   more messages, tools or prompts than a request may hold, tools larger than the
     context (the template ran first: 72 s for 290,000 empty messages);
5.   /v1/streams/lookup answers each session once, whatever the ids (amplification);
7.   a body with an Origin must be JSON (a typeless Blob needs no CORS preflight);
8.   the 500s: a lone surrogate as a slot file name, messages that are not objects,
     a "from" offset of "²";
9.   slot saves through a symlink, a FIFO as a slot file, the slot folder's path in a
     refusal, DELETE /v1/stream's silent end,
     a +inf logit bias at temperature > 0."""

from __future__ import annotations

import http.client
import json
import math
import os

import anyio
import pytest

from pydflash import Llama
from pydflash.server import Server
from pydflash.server.requests import MAX_MESSAGES, MAX_PROBS, MAX_PROMPTS, MAX_TOOLS
from pydflash.server.slots import MAX_SLOT_BODY
from pydflash.server.streams import MAX_LOOKUP_IDS, StreamSessions
from support.raw_http import Conn

PATHS = ("/completion", "/v1/completions", "/v1/chat/completions")
HELLO = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(target_path):
    with Llama(target_path, n_ctx=512, n_parallel=2) as llm:
        yield llm


@pytest.fixture(scope="module")
def server(llm, tmp_path_factory):
    srv = Server(llm, port=0, slot_save_path=tmp_path_factory.mktemp("slots")).start()
    yield srv
    srv.shutdown()


def call(srv: Server, method: str, path: str, body: object = None, headers: dict | None = None):
    """(status, the JSON reply or the text) of one request; ``body``: an object (sent as
    JSON with its type) or bytes (sent as they are, with ``headers`` only)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        hdrs = dict(headers or {})
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body, hdrs)
        r = conn.getresponse()
        raw = r.read()
    finally:
        conn.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw.decode("utf-8", "replace")


def request(path: str, **fields) -> dict:
    """A minimal body of ``path``'s kind with ``fields``."""
    base = {"messages": HELLO} if "chat" in path else {"prompt": "x"}
    return {**base, "max_tokens": 1, **fields}


def refused(srv: Server, path: str, body: object, status: int, *words: str) -> dict:
    got, res = call(srv, "POST", path, body)
    assert got == status, (got, res)
    for w in words:
        assert w in res["error"]["message"], res
    assert call(srv, "GET", "/health")[0] == 200  # and the server answers the next request
    return res


# -- 1-2. grammars and JSON schemas -------------------------------------------------------------

GRAMMARS = {
    "deep": ("root ::= " + "(" * 20000 + '"a"' + ")" * 20000, "grammar depth limit"),
    "bomb": ("root ::= " + '"a"{0,1999} ' * 1000, "grammar rule limit"),
    "max below min": ('root ::= "a"{5,2}', "maximum below its minimum"),
    "ambiguous": ("root ::= " + '"a"? ' * 1000 + '"b"', "grammar stack limit"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(GRAMMARS))
def test_grammars_over_a_limit_are_400s_naming_it(server, path, case):
    grammar, limit = GRAMMARS[case]
    refused(server, path, request(path, grammar=grammar), 400, limit)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", PATHS)
def test_schemas_over_a_limit_are_400s_naming_it(server, path):
    deep: dict = {"type": "string"}
    for _ in range(120):  # within the JSON parser's own nesting limit, over the converter's
        deep = {"type": "array", "items": deep}
    refused(server, path, request(path, json_schema=deep), 400, "JSON depth limit")
    short = {"type": "string", "minLength": 5, "maxLength": 2}
    refused(server, path, request(path, json_schema=short), 400, "maximum below its minimum")


# -- 3. top tokens per token ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fields", "name"),
    [
        ("/completion", {"n_probs": 4096}, "n_probs"),
        ("/v1/completions", {"logprobs": 4096}, "logprobs"),
        ("/v1/completions", {"n_probs": MAX_PROBS + 1}, "n_probs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": MAX_PROBS + 1}, "top_logprobs"),
    ],
)
def test_top_tokens_per_token_are_capped(server, path, fields, name):
    refused(server, path, request(path, **fields), 400, f"'{name}' must be at most {MAX_PROBS}")


def test_the_cap_itself_is_served(server):
    status, res = call(server, "POST", "/completion", request("/completion", n_probs=MAX_PROBS))
    assert status == 200 and len(res["completion_probabilities"][0]["top_logprobs"]) == MAX_PROBS


# -- 4. what one request may hold, refused before the template runs ------------------------------


@pytest.fixture
def templates(llm, monkeypatch) -> list[int]:
    """Counts the chat templates the server renders while the test runs."""
    seen: list[int] = []
    render = llm.apply_chat_template

    def counted(*args, **kwargs):
        seen.append(1)
        return render(*args, **kwargs)

    monkeypatch.setattr(llm, "apply_chat_template", counted)
    return seen


def tool(description: str = "f") -> dict:
    return {"type": "function", "function": {"name": "f", "description": description, "parameters": {}}}


CONVERSATIONS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/chat/completions", {"messages": HELLO, "tools": [tool()] * (MAX_TOOLS + 1)}, "tools"),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}, "messages"),
    ("/v1/messages", {"max_tokens": 1, "messages": HELLO, "tools": [{"name": "f"}] * (MAX_TOOLS + 1)}, "tools"),
    ("/v1/responses", {"input": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}, "input"),
    ("/apply-template", {"messages": [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)}, "messages"),
    ("/apply-template", {"messages": ["x"]}, "must be an object"),
    ("/chat/completions/input_tokens", {"messages": ["x"]}, "must be an object"),
]


@pytest.mark.parametrize(("path", "body", "names"), CONVERSATIONS)
def test_conversations_over_a_bound_are_refused_before_their_template(server, templates, path, body, names):
    refused(server, path, body, 400, names)
    assert templates == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages/count_tokens", "/apply-template"])
def test_tools_larger_than_the_context_are_refused_before_their_template(server, templates, path):
    big = "d" * (server.limit.longest_piece() * server.llm.n_ctx_slot + 1)
    body = {"messages": HELLO, "max_tokens": 1}
    if path == "/v1/messages/count_tokens":
        body["tools"] = [{"name": "f", "description": big, "input_schema": {}}]
    else:
        body["tools"] = [tool(big)]
    refused(server, path, body, 400, "exceeds the available context size")
    assert templates == []


def test_prompts_per_request_are_bounded(server):
    refused(server, "/completion", {"prompt": ["x"] * (MAX_PROMPTS + 1), "n_predict": 1}, 400, f"{MAX_PROMPTS}")
    status, res = call(server, "POST", "/completion", {"prompt": ["x"] * 2, "n_predict": 1})
    assert status == 200 and len(res) == 2


# -- 5. /v1/streams/lookup ------------------------------------------------------------------------


def test_a_lookup_answers_each_session_once():
    async def run() -> list:
        sessions = StreamSessions()
        for conv in ("c1", "c1::model-a", "c2"):
            sessions.open(conv, lambda: None)
        return sessions.lookup(["c1"] * MAX_LOOKUP_IDS + ["c3"])

    found = anyio.run(run)
    assert sorted(s["conversation_id"] for s in found) == ["c1", "c1::model-a"]


def test_a_lookup_of_too_many_ids_is_refused(server):
    body = {"conversation_ids": [f"c{i}" for i in range(MAX_LOOKUP_IDS + 1)]}
    refused(server, "/v1/streams/lookup", body, 400, f"at most {MAX_LOOKUP_IDS}")


# -- what a request asks is what it gets ---------------------------------------------------------


def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(server):
    # no Content-Length to refuse it by: the limit holds while the chunks stream in
    chunk = b"x" * 8192
    with Conn(server) as c:
        c.send(b"POST /slots/0?action=erase HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(MAX_SLOT_BODY // len(chunk) + 2):
            c.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, res = c.response()
    assert status == 413 and f"over {MAX_SLOT_BODY} bytes" in json.loads(res)["error"]["message"]


def test_the_server_passes_stop_on(server):
    body = {"prompt": "x", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    status, full = call(server, "POST", "/v1/completions", body)
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2 :][:3]
    assert status == 200 and len(text) > 6 and stop
    status, res = call(server, "POST", "/v1/completions", {**body, "stop": [stop]})
    assert status == 200 and res["choices"][0]["finish_reason"] == "stop"
    assert res["choices"][0]["text"] == text[: text.index(stop)]


def test_a_chat_templates_stop_strings_end_the_reply(server, llm):
    # the tiny model has no template of its own: ChatML, whose <|im_end|> is plain text here,
    # and a stop string of the template's
    assert "<|im_end|>" in llm.apply_chat_template(HELLO).stop
    grammar = 'root ::= "ab<|im_end|>cd"'
    status, res = call(server, "POST", "/v1/chat/completions", {"messages": HELLO, "grammar": grammar})
    assert status == 200 and res["choices"][0]["message"]["content"] == "ab", res


# -- 7. bodies a browser sends without a preflight -------------------------------------------------

BODY = json.dumps({"prompt": "x", "n_predict": 1}).encode()


@pytest.mark.parametrize("kind", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_from_a_page_must_be_json(server, kind):
    headers = {"Origin": "https://evil.example"} | ({"Content-Type": kind} if kind else {})
    status, res = call(server, "POST", "/completion", BODY, headers)
    assert status == 415 and "application/json" in res["error"]["message"]


def test_json_from_a_page_and_typeless_bodies_from_tools_are_read(server):
    page = {"Origin": "https://app.example", "Content-Type": "application/json; charset=utf-8"}
    assert call(server, "POST", "/completion", BODY, page)[0] == 200
    assert call(server, "POST", "/completion", BODY)[0] == 200  # curl -d with no type: no Origin, no page


# -- 8. what answered 500 -----------------------------------------------------------------------------


def test_a_lone_surrogate_is_no_slot_file_name(server):
    raw = b'{"filename": "\\ud800"}'
    status, res = call(server, "POST", "/slots/0?action=save", raw, {"Content-Type": "application/json"})
    assert status == 400 and res["error"]["param"] == "filename"


def test_a_superscript_offset_is_a_400(server):
    headers = {"X-Conversation-Id": "sup"}
    status, _ = call(server, "POST", "/completion", {"prompt": "x", "n_predict": 1, "stream": True}, headers)
    assert status == 200
    status, res = call(server, "GET", "/v1/stream?conv_id=sup&from=%C2%B2")
    assert status == 400 and "offset" in res["error"]["message"]


# -- 9. slot files, stopped streams, forced tokens -----------------------------------------------------


def test_a_slot_save_does_not_follow_a_link_out_of_the_folder(server, tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    os.symlink(outside, server.slot_save_path / "link")
    status, res = call(server, "POST", "/slots/0?action=save", {"filename": "link"})
    assert status == 400 and "regular file" in res["error"]["message"]
    assert outside.read_bytes() == b"keep"


def test_a_fifo_is_no_slot_file(server):
    os.mkfifo(server.slot_save_path / "fifo")
    for action in ("restore", "save"):
        status, res = call(server, "POST", f"/slots/0?action={action}", {"filename": "fifo"})
        assert status == 400 and "regular file" in res["error"]["message"]
    assert call(server, "GET", "/slots")[0] == 200


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [("none.bin", None, "no such slot file"), ("junk.bin", b"junk", "not a pydflash slot file")],
)
def test_a_slot_file_refusal_names_the_file_not_the_folder(server, name, content, why):
    if content is not None:
        (server.slot_save_path / name).write_bytes(content)
    status, res = call(server, "POST", "/slots/0?action=restore", {"filename": name})
    message = res["error"]["message"]
    assert status == 400 and message.startswith(name) and why in message
    assert str(server.slot_save_path) not in message


@pytest.mark.parametrize("named", [False, True])
def test_a_stopped_stream_ends_with_an_event_saying_so(named):
    async def run() -> list[bytes]:
        sessions = StreamSessions()
        stopped: list[bool] = []
        session = sessions.open("c1", lambda: stopped.append(True), named)
        session.write(b'data: {"content": "a"}\n\n')
        sessions.stop("c1")
        session.write(b'data: {"content": "late"}\n\n')  # what the generation still hands over
        assert stopped == [True]
        return [chunk async for chunk in session.read(0)]

    raw = b"".join(anyio.run(run)).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert len(events) == 2 and "late" not in raw
    last = events[-1]
    assert last.startswith("event: error\n" if named else "data: ")
    data = json.loads(last.split("data: ", 1)[1])
    assert "stopped: a DELETE" in data["error"]["message"] and (data.get("type") == "error") == named


def test_an_infinite_bias_forces_its_token_when_sampling(server, llm):
    r = llm.generate("x", max_tokens=4, temperature=1.0, seed=3, logit_bias={77: math.inf})
    assert r.tokens == [77] * 4
    # JSON's 1e999 is +inf once parsed
    raw = b'{"prompt": "x", "n_predict": 4, "temperature": 1.0, "seed": 3, "return_tokens": true, '
    raw += b'"logit_bias": {"77": 1e999}}'
    status, res = call(server, "POST", "/completion", raw, {"Content-Type": "application/json"})
    assert status == 200 and res["tokens"] == [77] * 4
