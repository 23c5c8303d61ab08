"""OpenAI's Responses API through the real ``openai`` SDK against a server on
127.0.0.1: a reply, a streamed function call, the call's output sent back, and
input token counting. The phrase model of test_chat_tools makes the greedy reply
deterministic (a logit_bias forces the call)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from pydflash import Llama
from pydflash.server import Server

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


@pytest.fixture(scope="module")
def server(phrase_files):
    t, d, ids = phrase_files
    with Llama(t, draft=d, n_ctx=2048) as llm, Server(llm, port=0) as srv:
        yield srv, ids


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server[0].url + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c


def test_a_reply(client):
    res = client.responses.create(model="x", input="Weather in Paris?", max_output_tokens=4, temperature=0)
    assert res.status == "incomplete" and res.usage.output_tokens == 4
    assert res.output[0].type == "message" and res.output_text == res.output[0].content[0].text != ""


def test_a_function_call_streamed_and_answered(server, client):
    _, ids = server
    kw = dict(model="x", input="Weather in Paris?", tools=TOOLS, max_output_tokens=1, temperature=0,
              extra_body={"logit_bias": {str(ids["call"]): 100}})
    res = client.responses.create(**kw)
    calls = [o for o in res.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    events = list(client.responses.create(stream=True, **kw))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in done] == [("get_weather", {"city": "Paris"})]
    follow = client.responses.create(model="x", max_output_tokens=2, temperature=0, tools=TOOLS, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}])
    assert follow.usage.input_tokens > res.usage.input_tokens


def test_input_tokens_and_refusals(server, client):
    srv = server[0]
    import urllib.request
    req = urllib.request.Request(srv.url + "/v1/responses/input_tokens", json.dumps(
        {"input": "Weather in Paris?"}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.loads(r.read())
    assert body["object"] == "response.input_tokens" and body["input_tokens"] > 0
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="x", input="hi", previous_response_id="resp_1")
    # a token budget out of range is named by the field the request sent
    with pytest.raises(openai.BadRequestError, match="Field 'max_output_tokens'") as e:
        client.responses.create(model="x", input="hi", max_output_tokens=-2)
    assert e.value.body["param"] == "max_output_tokens"


def test_timings_per_token_and_the_last_event(server):
    body = {"input": "Weather in Paris?", "max_output_tokens": 3, "temperature": 0, "stream": True,
            "timings_per_token": True}
    req = urllib.request.Request(server[0].url + "/v1/responses", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all(e["timings"]["predicted_n"] > 0 for e in deltas)
    assert [e["timings"]["predicted_n"] for e in deltas] == sorted(e["timings"]["predicted_n"] for e in deltas)
    last = events[-1]  # llama-server's: response.completed even when the budget ran out
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"
    assert last["timings"]["predicted_n"] == last["response"]["usage"]["output_tokens"] == 3
