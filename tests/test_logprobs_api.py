"""Logprobs in the OpenAI-shaped API: completions (``logprobs=N``, llama-server's
``n_probs``) and chat (``logprobs``/``top_logprobs``), whole and streamed, in-process
and through the server with the real ``openai`` client. The values are those of
``Llama.generate(logprobs=True)`` (whose precision tests/test_logprobs.py checks)."""

from __future__ import annotations

import dataclasses
import json
import math
import urllib.request

import pytest

from pydflash import Llama, gguf_writers
from pydflash.server import Server
from support.models import TARGET

openai = pytest.importorskip("openai")

MSGS = [{"role": "user", "content": "count to five"}]
GREEDY = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def llm(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("lpapi")
    chat = dataclasses.replace(TARGET, chat_template=gguf_writers.THINKING_TEMPLATE)
    t = gguf_writers.write_target(d / "target-chat.gguf", chat)
    # logprobs are compared exactly between runs: the same draft lengths, so the same batch
    # shapes (other shapes move the last bits of a row); the adaptive ones follow timings
    with Llama(t, draft=model_dir / "drafter-b8.gguf", n_ctx=1024, draft_adaptive=False) as m:
        yield m


@pytest.fixture(scope="module")
def client(llm):
    srv = Server(llm, port=0, alias="tiny").start()
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c  # closed: its pooled sockets would warn wherever the collector finds them
    srv.shutdown()


def piece(llm: Llama, t: int) -> str:
    return llm.core_model.token_to_piece(t, False).decode("utf-8", errors="replace")


def test_completion_logprobs_in_process(llm: Llama):
    ref = llm.generate("x = 1", max_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=3)
    res = llm.create_completion("x = 1", logprobs=3, **GREEDY)
    lp = res["choices"][0]["logprobs"]
    assert lp is not None and ref.logprobs is not None
    assert lp["token_logprobs"] == [x.logprob for x in ref.logprobs]
    assert lp["tokens"] == [piece(llm, x.token) for x in ref.logprobs]
    # a token may end inside a UTF-8 character (its text shows U+FFFD): the bytes make the text
    raw = b"".join(llm.core_model.token_to_piece(x.token, False) for x in ref.logprobs)
    assert raw.decode("utf-8", errors="replace") == res["choices"][0]["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert all(len(top) <= 3 for top in lp["top_logprobs"])
    # without logprobs: None, as before
    assert llm.create_completion("x = 1", **GREEDY)["choices"][0]["logprobs"] is None


def test_completion_logprobs_streamed_equal_whole(llm: Llama):
    whole = llm.create_completion("x = 1", logprobs=2, **GREEDY)["choices"][0]["logprobs"]
    assert whole is not None
    tokens, values, offsets = [], [], []
    for chunk in llm.create_completion("x = 1", logprobs=2, stream=True, **GREEDY):
        lp = chunk["choices"][0]["logprobs"]
        if lp is not None:
            tokens += lp["tokens"]
            values += lp["token_logprobs"]
            offsets += lp["text_offset"]
    assert (tokens, values, offsets) == (whole["tokens"], whole["token_logprobs"], whole["text_offset"])


def test_chat_logprobs_in_process_and_streamed(llm: Llama):
    res = llm.create_chat_completion(MSGS, logprobs=True, top_logprobs=2, **GREEDY)
    content = res["choices"][0]["logprobs"]["content"]  # type: ignore[index]
    assert len(content) == res["usage"]["completion_tokens"]
    for e in content:
        assert bytes(e["bytes"]).decode("utf-8", errors="replace") == e["token"]
        assert len(e["top_logprobs"]) == 2 and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert e["logprob"] <= 0.0
    streamed = []
    for chunk in llm.create_chat_completion(MSGS, logprobs=True, top_logprobs=2, stream=True, **GREEDY):
        lp = chunk["choices"][0]["logprobs"]
        if lp is not None:
            streamed += lp["content"]
    assert streamed == content


def test_logprob_option_errors(llm: Llama):
    with pytest.raises(ValueError, match="top_logprobs needs logprobs=True"):
        llm.create_chat_completion(MSGS, top_logprobs=2, max_tokens=2)
    with pytest.raises(ValueError, match="echo"):
        llm.create_completion("x", logprobs=1, echo=True, max_tokens=2)
    with pytest.raises(ValueError, match="top_logprobs must be >= 0"):
        llm.create_completion("x", logprobs=-1, max_tokens=2)
    assert llm.create_completion("x", max_tokens=2)["usage"]["completion_tokens"] >= 1  # still usable


def test_server_completion_logprobs_with_the_openai_client(llm: Llama, client):
    ref = llm.create_completion("x = 1", logprobs=3, **GREEDY)["choices"][0]["logprobs"]
    extra = {"ignore_eos": True}
    r = client.completions.create(model="tiny", prompt="x = 1", max_tokens=12, temperature=0, logprobs=3,
                                  extra_body=extra)
    lp = r.choices[0].logprobs
    assert lp.tokens == ref["tokens"] and lp.text_offset == ref["text_offset"]
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(lp.token_logprobs, ref["token_logprobs"]))
    assert [dict(t) for t in lp.top_logprobs] == ref["top_logprobs"]
    # llama-server's n_probs means the same
    body = {"prompt": "x = 1", "max_tokens": 12, "temperature": 0, "n_probs": 3, "ignore_eos": True}
    req = urllib.request.Request(client.base_url.__str__() + "completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert json.loads(resp.read())["choices"][0]["logprobs"]["tokens"] == ref["tokens"]


def test_server_chat_logprobs_whole_and_streamed(client):
    kw = dict(model="tiny", messages=MSGS, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 for e in content)
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


def test_server_logprob_errors_are_400(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs=True"):
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="'logprobs' must be int"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"logprobs": "3"})
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logprobs=1, echo=True)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens >= 1
