"""Anthropic's Messages API through the real ``anthropic`` SDK against a server on
127.0.0.1: a reply, a streamed tool call, token counting and ``x-api-key``. The
tool-call model of test_chat_tools (whole phrases as single tokens, a logit_bias
forces the call) makes the greedy reply deterministic."""

from __future__ import annotations

import pytest

from pydflash import Llama
from pydflash.server import Server

anthropic = pytest.importorskip("anthropic")

TOOLS = [{"name": "get_weather", "description": "Current weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]
GREEDY = {"temperature": 0}  # (this SDK's create() has no temperature argument: sent as an extra field)


@pytest.fixture(scope="module")
def server(phrase_files):
    t, d, ids = phrase_files
    with Llama(t, draft=d, n_ctx=2048) as llm, Server(llm, port=0, api_keys=["sk-test"]) as srv:
        yield srv, ids


@pytest.fixture(scope="module")
def client(server):
    with anthropic.Anthropic(base_url=server[0].url, api_key="sk-test", max_retries=0, timeout=120) as c:
        yield c  # sends the key as x-api-key


def test_a_reply(client):
    msg = client.messages.create(model="x", max_tokens=4, messages=MSGS, extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 4
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.usage.cache_read_input_tokens is not None and "timings" not in msg.model_dump()  # as llama-server


def test_a_tool_call_and_its_stream(server, client):
    _, ids = server
    kw = dict(model="x", max_tokens=1, messages=MSGS, tools=TOOLS,
              extra_body={**GREEDY, "logit_bias": {str(ids["call"]): 100}})
    msg = client.messages.create(**kw)
    assert msg.stop_reason == "tool_use"
    use = [b for b in msg.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in use] == [("get_weather", {"city": "Paris"})]
    with client.messages.stream(**kw) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("get_weather", {"city": "Paris"})]
    # the answer to the call, as the SDK sends it back
    follow = client.messages.create(model="x", max_tokens=2, extra_body=GREEDY, tools=TOOLS, messages=[
        *MSGS, {"role": "assistant", "content": [b.model_dump() for b in use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "sunny"}]}])
    assert follow.usage.input_tokens > msg.usage.input_tokens


def test_count_tokens(client):
    n = client.messages.count_tokens(model="x", messages=MSGS)
    m = client.messages.count_tokens(model="x", messages=MSGS, tools=TOOLS)
    assert 0 < n.input_tokens < m.input_tokens


def test_a_wrong_key_is_a_401(server):
    with (
        anthropic.Anthropic(base_url=server[0].url, api_key="nope", max_retries=0) as c,
        pytest.raises(anthropic.AuthenticationError),
    ):
        c.messages.create(model="x", max_tokens=1, messages=MSGS)


def test_a_stream_starts_with_the_prompts_usage(client):
    total = client.messages.count_tokens(model="x", messages=MSGS).input_tokens
    with client.messages.stream(model="x", max_tokens=3, messages=MSGS, extra_body=GREEDY) as stream:
        start = next(iter(stream))
        list(stream)
    assert start.type == "message_start"
    usage = start.message.usage  # llama-server's: the evaluated tokens, and apart those from the cache
    assert usage.input_tokens > 0 and usage.input_tokens + usage.cache_read_input_tokens == total


def test_empty_messages_get_a_reply(client):
    msg = client.messages.create(model="x", max_tokens=2, messages=[], extra_body=GREEDY)
    assert msg.type == "message" and msg.usage.input_tokens > 0


PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


@pytest.mark.parametrize("content", [
    [{"type": "image", "source": PNG}, {"type": "text", "text": "What is this?"}],
    [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "f.png"},
                                                              {"type": "image", "source": PNG}]}],
], ids=["image", "image in a tool result"])
def test_an_image_is_llama_servers_500(client, content):
    with pytest.raises(anthropic.InternalServerError) as e:
        client.messages.create(model="x", max_tokens=2, messages=[{"role": "user", "content": content}])
    assert e.value.status_code == 500
    assert e.value.body["error"]["message"].startswith("image input is not supported")
    assert e.value.body["error"]["type"] == "server_error"
