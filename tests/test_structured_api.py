"""Structured output through the OpenAI-shaped API and the server: ``response_format``
(``json_object``, ``json_schema``), llama-server's ``json_schema`` and ``grammar`` fields,
in completions and chat, whole and streamed, in-process and with the real ``openai``
client; bad combinations are ValueErrors in-process and 400s over HTTP."""

from __future__ import annotations

import json

import pytest

from pydflash import Llama
from pydflash.server import Server

openai = pytest.importorskip("openai")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer", "minimum": 0}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "A record as JSON, please."}]


def fits(text: str) -> bool:
    obj = json.loads(text)
    return (
        set(obj) == {"name", "n"} and isinstance(obj["name"], str) and len(obj["name"]) <= 10
        and isinstance(obj["n"], int) and not isinstance(obj["n"], bool) and obj["n"] >= 0
    )  # fmt: skip


@pytest.fixture
def llm(embedded_dflash: Llama) -> Llama:
    return embedded_dflash


@pytest.fixture(scope="module")
def client(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0, alias="pair").start()
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300) as c:
        yield c  # closed: its pooled sockets would warn wherever the collector finds them
    srv.shutdown()


RESPONSE_FORMATS = {
    "json_schema": {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}},
    "json_object+schema": {"type": "json_object", "schema": SCHEMA},  # llama-server's form
}


@pytest.mark.parametrize("rf", sorted(RESPONSE_FORMATS))
def test_completion_response_format(llm: Llama, rf: str):
    for temperature in (0.0, 0.8):
        res = llm.create_completion("record = ", max_tokens=120, temperature=temperature, seed=4,
                                    response_format=RESPONSE_FORMATS[rf])
        assert fits(res["choices"][0]["text"]), res["choices"][0]["text"]
    text = "".join(c["choices"][0]["text"] for c in llm.create_completion(
        "record = ", max_tokens=120, temperature=0, stream=True, response_format=RESPONSE_FORMATS[rf]))
    assert fits(text)


def test_completion_json_object_grammar_and_json_schema_fields(llm: Llama):
    res = llm.create_completion("cfg = ", max_tokens=120, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(res["choices"][0]["text"]), dict)
    res = llm.create_completion("cfg = ", max_tokens=120, temperature=0, json_schema=SCHEMA)
    assert fits(res["choices"][0]["text"])
    res = llm.create_completion("x = ", max_tokens=12, temperature=0, grammar='root ::= [0-9]{1,4} ";"')
    text = res["choices"][0]["text"]
    assert text.endswith(";") and text[:-1].isdigit() and len(text) <= 5


@pytest.mark.parametrize("rf", sorted(RESPONSE_FORMATS))
def test_chat_response_format_whole_and_streamed(llm: Llama, rf: str):
    res = llm.create_chat_completion(MSGS, max_tokens=120, temperature=0, response_format=RESPONSE_FORMATS[rf])
    whole = res["choices"][0]["message"]["content"]
    assert whole is not None and fits(whole)
    chunks = llm.create_chat_completion(MSGS, max_tokens=120, temperature=0, stream=True,
                                        response_format=RESPONSE_FORMATS[rf])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == whole


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(response_format={"type": "xml"}), "response_format type must be"),
        (dict(response_format={"type": "json_object"}, json_schema=SCHEMA), "not both"),
        (dict(json_schema=SCHEMA, grammar='root ::= "a"'), "not both"),
        (dict(grammar="root ::= ["), "does not parse"),
        (dict(response_format={"type": "json_schema", "json_schema": {"schema": 3}}), "must be an object"),
    ],
)
def test_bad_structured_options(llm: Llama, kw: dict, match: str):
    with pytest.raises(ValueError, match=match):
        llm.create_completion("x", max_tokens=2, **kw)
    with pytest.raises(ValueError, match=match):
        llm.create_chat_completion(MSGS, max_tokens=2, **kw)
    assert llm.create_completion("x", max_tokens=2)["usage"]["completion_tokens"] >= 1


def test_grammar_with_tools_is_refused(llm: Llama):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with pytest.raises(ValueError, match="cannot be combined with tools"):
        llm.create_chat_completion(MSGS, max_tokens=2, tools=tools, grammar='root ::= "a"')


def test_server_structured_output_with_the_openai_client(client):
    r = client.chat.completions.create(model="pair", messages=MSGS, max_tokens=120, temperature=0,
                                       response_format=RESPONSE_FORMATS["json_schema"])
    assert fits(r.choices[0].message.content)
    r = client.completions.create(model="pair", prompt="record = ", max_tokens=120, temperature=0,
                                  extra_body={"json_schema": SCHEMA})
    assert fits(r.choices[0].text)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="pair", prompt="v = ", max_tokens=12, temperature=0, stream=True,
        extra_body={"grammar": 'root ::= [0-9]{1,4} ";"'}))
    assert text.endswith(";") and text[:-1].isdigit()


def test_server_structured_errors_are_400(client):
    with pytest.raises(openai.BadRequestError, match="does not parse"):
        client.completions.create(model="pair", prompt="x", max_tokens=2, extra_body={"grammar": "root ::= ["})
    with pytest.raises(openai.BadRequestError, match="'grammar' must be str"):
        client.completions.create(model="pair", prompt="x", max_tokens=2, extra_body={"grammar": 5})
    with pytest.raises(openai.BadRequestError, match="not both"):
        client.chat.completions.create(model="pair", messages=MSGS, max_tokens=2,
                                       response_format={"type": "json_object"}, extra_body={"json_schema": SCHEMA})
    assert client.completions.create(model="pair", prompt="x", max_tokens=2).usage.completion_tokens >= 1


def test_chat_user_grammar(llm: Llama):
    res = llm.create_chat_completion(MSGS, max_tokens=8, temperature=0, grammar='root ::= "yes" | "no"')
    assert res["choices"][0]["message"]["content"] in ("yes", "no")
