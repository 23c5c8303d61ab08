"""The token budget: one rule (``Generation.tokens_left``; ``max_tokens`` None runs
until the context is full) and llama-server's ``n_predict`` / ``max_tokens`` on
every endpoint: -1 (or absent, without ``-n``) runs until EOS or a full context,
0 samples one token (vendor/llama.cpp/tools/server/server-context.cpp: the budget
is checked only after a token, ``n_gen > 0 && !has_budget()``), below -1 is a 400,
and a request's own value takes priority over ``-n``. A tiny pair with a 64-token
context, served in this process."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pydflash import Llama, gguf_writers
from pydflash.config import SamplingConfig
from pydflash.engine.generation import Generation
from pydflash.engine.request import make_request
from pydflash.server import Server
from support.models import TARGET

N_CTX = 64
PROMPT = list(range(1, 41))  # 40 tokens: 24 left in the context
GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, model_dir: Path):
    d = tmp_path_factory.mktemp("budget")
    spec = dataclasses.replace(TARGET, chat_template=gguf_writers.THINKING_TEMPLATE)
    target = gguf_writers.write_target(d / "t.gguf", spec)
    with Llama(target, draft=model_dir / "drafter-b8.gguf", n_ctx=N_CTX) as llm:
        yield llm


@pytest.fixture(scope="module")
def server(small: Llama):
    srv = Server(small, port=0).start()
    yield srv
    srv.shutdown()


@pytest.fixture(scope="module")
def server_n4(small: Llama):
    srv = Server(small, port=0, defaults={"max_tokens": 4}).start()  # serve -n 4
    yield srv
    srv.shutdown()


def call(srv: Server, path: str, data: dict) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + path, json.dumps(data).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _generation(llm: Llama, cfg: SamplingConfig) -> Generation:
    return Generation(llm, make_request(llm.prompt_tokens(PROMPT), cfg, llm.pair, llm.config))


def test_none_is_what_the_context_has_left(small):
    gen = _generation(small, SamplingConfig(max_tokens=None))
    assert gen.tokens_left == N_CTX - len(PROMPT)
    assert _generation(small, SamplingConfig(max_tokens=5)).tokens_left == 5
    res = small.generate(PROMPT, max_tokens=None, ignore_eos=True)
    assert res.finish_reason == "length" and len(res.tokens) == N_CTX - len(PROMPT)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingConfig(max_tokens=-1)


def test_create_completion_fills_the_context_as_llama_cpp_python(small):
    for n in (None, 0, -1):  # llama-cpp-python: None or <= 0 is what the context has left
        out = small.create_completion(PROMPT, max_tokens=n, **GREEDY)
        assert out["usage"]["completion_tokens"] == N_CTX - len(PROMPT), n
        assert out["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("field", ["n_predict", "max_tokens", "max_completion_tokens"])
def test_native_n_predict(server, small, field):
    status, res = call(server, "/completion", {"prompt": PROMPT, field: -1, **GREEDY})
    assert status == 200, res
    assert res["tokens_predicted"] == N_CTX - len(PROMPT) and res["stop_type"] == "limit"
    assert res["truncated"] is True  # stopped by the context, as llama-server says
    want = small.generate(PROMPT, max_tokens=1, **GREEDY)
    status, res = call(server, "/completion", {"prompt": PROMPT, field: 0, "return_tokens": True, **GREEDY})
    assert status == 200, res
    assert res["tokens"] == want.tokens and res["tokens_predicted"] == 1 and res["stop_type"] == "limit"
    assert res["truncated"] is False and res["generation_settings"]["n_predict"] == 0
    status, res = call(server, "/completion", {"prompt": PROMPT, field: -2})
    assert status == 400 and f"Field '{field}'" in res["error"]["message"], res


def test_n_predict_takes_priority_over_its_alias(server):
    status, res = call(server, "/completion", {"prompt": PROMPT, "n_predict": 3, "max_tokens": 5, **GREEDY})
    assert status == 200 and res["tokens_predicted"] == 3
    body = {"messages": [{"role": "user", "content": "hi"}], "n_predict": 2, "max_completion_tokens": 5, **GREEDY}
    status, res = call(server, "/v1/chat/completions", body)
    assert status == 200 and res["usage"]["completion_tokens"] == 2


def test_native_stream_n_predict_0(server):
    req = urllib.request.Request(
        server.url + "/completion",
        json.dumps({"prompt": PROMPT, "n_predict": 0, "stream": True, **GREEDY}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        chunks = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert sum(len(c["tokens"]) for c in chunks) == 1 and chunks[-1]["stop"] is True
    assert chunks[-1]["tokens_predicted"] == 1 and chunks[-1]["stop_type"] == "limit"


def test_openai_completions(server):
    status, res = call(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": -1, **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == N_CTX - len(PROMPT)
    assert res["choices"][0]["finish_reason"] == "length"
    status, res = call(server, "/v1/completions", {"prompt": PROMPT, **GREEDY})  # absent: -1, as llama-server
    assert status == 200 and res["usage"]["completion_tokens"] == N_CTX - len(PROMPT)
    status, res = call(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == 1
    assert res["choices"][0]["finish_reason"] == "length"
    status, res = call(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": -3})
    assert status == 400 and "max_tokens" in res["error"]["message"]


def test_chat_completions(server):
    msgs = [{"role": "user", "content": "hi"}]
    status, res = call(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": -1, **GREEDY})
    assert status == 200, res
    assert res["usage"]["completion_tokens"] == N_CTX - res["usage"]["prompt_tokens"]
    status, res = call(server, "/v1/chat/completions", {"messages": msgs, "max_tokens": 0, **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == 1
    status, res = call(server, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": -2})
    assert status == 400 and "max_completion_tokens" in res["error"]["message"]


def test_anthropic_and_responses(server):
    msgs = [{"role": "user", "content": "hi"}]
    status, res = call(server, "/v1/messages", {"messages": msgs, "max_tokens": 0, **GREEDY})
    assert status == 200 and res["usage"]["output_tokens"] == 1 and res["stop_reason"] == "max_tokens"
    status, res = call(server, "/v1/messages", {"messages": msgs, "max_tokens": -1, **GREEDY})
    assert status == 200 and res["stop_reason"] == "max_tokens"
    assert res["usage"]["input_tokens"] + res["usage"]["output_tokens"] == N_CTX
    status, res = call(server, "/v1/responses", {"input": "hi", "max_output_tokens": 0, **GREEDY})
    assert status == 200 and res["usage"]["output_tokens"] == 1


def test_a_request_takes_priority_over_dash_n(server_n4):
    # llama-server: n_predict_max = the request's n_predict unless -1, else -n
    status, res = call(server_n4, "/completion", {"prompt": PROMPT, **GREEDY})
    assert status == 200 and res["tokens_predicted"] == 4
    status, res = call(server_n4, "/completion", {"prompt": PROMPT, "n_predict": -1, **GREEDY})
    assert status == 200 and res["tokens_predicted"] == 4
    status, res = call(server_n4, "/completion", {"prompt": PROMPT, "n_predict": 6, **GREEDY})
    assert status == 200 and res["tokens_predicted"] == 6
    status, res = call(server_n4, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == 6
    status, res = call(server_n4, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == 4
