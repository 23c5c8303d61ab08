"""The chat request checks llama-server makes before any generation, on a server
on 127.0.0.1: each refused body is a 400 with llama-server's message."""

from __future__ import annotations

import pytest

from pydflash import Llama
from pydflash.server import Server
from support.http import post


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
