"""Chat requests as llama-server reads them, on a server on 127.0.0.1: the checks it
makes before any generation (a 400 with its message), and timings_per_token."""

from __future__ import annotations

import json
import urllib.request

import pytest

from pydflash import Llama
from pydflash.server import Server
from support.http import metrics, post


@pytest.fixture(scope="module")
def server(spread_files):
    t, d = spread_files
    with Llama(t, draft=d, n_ctx=512) as llm, Server(llm, port=0) as srv:
        yield srv.url


def test_two_assistant_messages_at_the_end_are_refused(server):
    msgs = [{"role": "user", "content": "test"}, {"role": "assistant", "content": "a"}]
    status, res = post(server, {"messages": [*msgs, {"role": "assistant", "content": "b"}]}, "/v1/chat/completions")
    assert status == 400
    assert res["error"]["message"] == "Cannot have 2 or more assistant messages at the end of the list."
    # one final assistant message is continued, as llama-server's prefill does
    status, res = post(server, {"messages": msgs, "max_tokens": 2, "temperature": 0}, "/v1/chat/completions")
    assert status == 200 and res["usage"]["completion_tokens"] == 2


def test_timings_per_token_and_the_metrics(server):
    before = metrics(server)["llamacpp:tokens_predicted_total"]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0, "stream": True,
            "ignore_eos": True, "timings_per_token": True}
    req = urllib.request.Request(server + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        lines = r.read().decode().splitlines()
    chunks = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    text = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert text and all(c["timings"]["predicted_n"] > 0 for c in text)
    assert "timings" not in chunks[0]  # the role's chunk, as llama-server's
    # each chunk has timings, the generation is counted once
    assert metrics(server)["llamacpp:tokens_predicted_total"] == before + 4


CODING = [{"role": "system", "content": "You are a coding assistant."}, {"role": "user", "content": "Write an example"}]


def test_no_jinja_constrains_the_reply_with_the_schema_alone(embedded_dflash):
    # llama-server's --no-jinja: the schema's grammar from the reply's first token (the
    # template's reply format would first allow whitespace and a ```json fence)
    with Server(embedded_dflash, port=0, defaults={"jinja": False}) as srv:
        for fmt, want in (({"json_schema": {"const": "42"}}, '"42"'),
                          ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"const": "fooo"}}}},
                           '"fooo"')):
            status, res = post(srv.url, {"messages": CODING, "max_tokens": 8, "temperature": 0, **fmt},
                               "/v1/chat/completions")
            assert status == 200 and res["choices"][0]["message"]["content"] == want
        tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
        status, res = post(srv.url, {"messages": CODING, "tools": tools}, "/v1/chat/completions")
        assert status == 400 and "--jinja" in res["error"]["message"]
