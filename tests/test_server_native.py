"""llama-server's API under its names and shapes (issue #48 part 1): the native
completion, tokenize/detokenize, props, apply-template, input_tokens, model
aliases, llamacpp: metrics, the refusals of what pydflash does not do, and the
serve flags under llama-server's names. A real server on 127.0.0.1 (the embedded
pair, in this process); outputs are checked against the library's own."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import pydflash
from pydflash import Llama
from pydflash.server import Server
from support.raw_http import events

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0, alias="code,pair", metrics=True).start()
    yield srv
    srv.shutdown()


def call(srv: Server, path: str, data: dict | None = None, method: str | None = None) -> tuple[int, dict, object]:
    raw = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(srv.url + path, raw, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            body = r.read()
            ctype = r.headers.get("content-type", "")
            return r.status, dict(r.headers), json.loads(body) if "json" in ctype else body.decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def test_native_completion(server, embedded_dflash):
    want = embedded_dflash.generate("def f(x):", max_tokens=8, **GREEDY)
    status, _, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 8, "return_tokens": True,
                                                 **GREEDY})
    assert status == 200, res
    assert res["content"] == want.text and res["tokens"] == want.tokens
    assert res["stop"] is True and res["stop_type"] == "limit" and res["tokens_predicted"] == 8
    assert res["tokens_evaluated"] == len(embedded_dflash.tokenize("def f(x):"))
    assert res["generation_settings"]["n_predict"] == 8 and res["timings"]["predicted_n"] == 8
    assert res["model"] == server.alias
    status, _, oai = call(server, "/v1/completions", {"prompt": "def f(x):", "max_tokens": 2, **GREEDY})
    assert oai["system_fingerprint"].startswith("b")
    # /completions is llama-server's native endpoint too
    status, _, again = call(server, "/completions", {"prompt": "def f(x):", "n_predict": 8, **GREEDY})
    assert status == 200 and again["content"] == want.text


def test_n_predict_0_samples_one_token(server):
    # llama-server checks the budget only after a sampled token (tests/test_server_budget.py)
    status, _, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 0})
    assert status == 200 and res["tokens_predicted"] == 1 and res["stop_type"] == "limit"


def test_native_stream(server, embedded_dflash):
    want = embedded_dflash.generate("def f(x):", max_tokens=8, **GREEDY)
    req = urllib.request.Request(server.url + "/completion", json.dumps(
        {"prompt": "def f(x):", "n_predict": 8, "stream": True, **GREEDY}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        evs = events(r.read())
    assert "[DONE]" not in evs  # llama-server's native stream has none
    assert "".join(e["content"] for e in evs) == want.text
    assert evs[-1]["stop"] is True and evs[-1]["timings"]["predicted_n"] == 8
    assert all(e["stop"] is False and e["tokens"] for e in evs[:-1])  # a stream's chunks carry their tokens


def test_native_probs_and_prompt_forms(server, embedded_dflash):
    ids = embedded_dflash.tokenize("def f(x):")
    status, _, res = call(server, "/completion", {"prompt": ids, "n_predict": 4, "n_probs": 3, **GREEDY})
    assert status == 200
    probs = res["completion_probabilities"]
    assert len(probs) == 4 and all(len(p["top_logprobs"]) == 3 for p in probs)
    assert all(p["top_logprobs"][0]["id"] == p["id"] for p in probs)  # greedy: the top token is the one taken
    status, _, post = call(server, "/completion", {"prompt": ids, "n_predict": 2, "n_probs": 2,
                                                    "post_sampling_probs": True, **GREEDY})
    assert 0 < post["completion_probabilities"][0]["prob"] <= 1 and "top_probs" in post["completion_probabilities"][0]
    status, _, mixed = call(server, "/completion", {"prompt": ["def", ids[-1]], "n_predict": 2, **GREEDY})
    assert status == 200 and mixed["tokens_evaluated"] == len(embedded_dflash.tokenize("def")) + 1
    status, _, many = call(server, "/completion", {"prompt": ["def f", "class A"], "n_predict": 2, **GREEDY})
    assert status == 200 and [r["index"] for r in many] == [0, 1]


def test_tokenize_detokenize(server, embedded_dflash):
    status, _, res = call(server, "/tokenize", {"content": "def f(x):"})
    assert status == 200 and res["tokens"] == embedded_dflash.tokenize(b"def f(x):", add_bos=False, special=True)
    status, _, pieces = call(server, "/tokenize", {"content": "def f", "with_pieces": True})
    assert "".join(p["piece"] for p in pieces["tokens"]) == "def f"
    assert [p["id"] for p in pieces["tokens"]] == embedded_dflash.tokenize(b"def f", add_bos=False, special=True)
    status, _, text = call(server, "/detokenize", {"tokens": res["tokens"]})
    assert status == 200 and text["content"] == "def f(x):"
    ids = call(server, "/tokenize", {"content": "What is it ?"})[2]["tokens"]
    assert call(server, "/detokenize", {"tokens": ids})[2]["content"] == "What is it ?"  # spaces as they were


def test_props_models_and_templates(server, embedded_dflash):
    status, headers, props = call(server, "/props")
    assert status == 200 and props["total_slots"] == 1
    assert props["default_generation_settings"]["n_ctx"] == embedded_dflash.n_ctx_slot
    assert props["model_path"].endswith(".gguf") and "/" not in props["model_path"]
    assert call(server, "/props", {}, method="POST")[0] == 501
    status, _, models = call(server, "/v1/models")
    card = models["data"][0]
    assert card["id"] == "code" and set(card["aliases"]) == {"code", "pair"} and card["tags"] == []
    msgs = [{"role": "user", "content": "hello there"}]
    status, _, tmpl = call(server, "/apply-template", {"messages": msgs})
    assert status == 200 and "hello there" in tmpl["prompt"]
    status, _, count = call(server, "/chat/completions/input_tokens", {"messages": msgs})
    assert status == 200 and count["input_tokens"] == len(embedded_dflash.tokenize(tmpl["prompt"]))


def test_chat_fields_as_llama_server(server):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def"}]
    status, _, res = call(server, "/v1/chat/completions", {"messages": msgs, "continue_final_message": True})
    assert status == 400 and "add_generation_prompt" in res["error"]["message"]
    status, _, res = call(server, "/v1/chat/completions", {"messages": msgs[:1], "n_predict": 3, **GREEDY})
    assert status == 200 and res["usage"]["completion_tokens"] == 3


def test_first_chat_chunk_content_is_null(server):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        chunks = list(client.chat.completions.create(model="code", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=3, stream=True, temperature=0))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None


@pytest.mark.parametrize("path, data, feature", [
    ("/v1/embeddings", {"input": "x"}, "embeddings"),
    ("/rerank", {"query": "x", "documents": ["y"]}, "rerank"),
    ("/lora-adapters", [], "LoRA"),
    ("/models/load", {"model": "x"}, "router"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}, "multimodal"),
    ("/completion", {"prompt": "x", "lora": [{"id": 0, "scale": 1}]}, "LoRA"),
    ("/infill", {"input_prefix": "def f(", "input_suffix": ")"}, "Infill is not supported by this model"),
], ids=["embeddings", "rerank", "lora", "router", "multimodal", "lora field", "infill without FIM"])
def test_what_pydflash_does_not_do_is_a_501(server, path, data, feature):
    status, _, res = call(server, path, data)
    assert status == 501 and res["error"]["type"] == "not_supported_error" and feature in res["error"]["message"]


def test_llamacpp_metrics(server):
    call(server, "/completion", {"prompt": "def f", "n_predict": 4, **GREEDY})
    status, headers, text = call(server, "/metrics")
    assert status == 200 and "process-start-time-unix" in {k.lower() for k in headers}
    types, values = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE llamacpp:"):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line.startswith("llamacpp:"):
            name, value = line.split(" ", 1)
            values[name] = float(value)
    for name in ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total",
                 "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"):
        assert types["llamacpp:" + name] == "counter"
    for name in ("requests_processing", "requests_deferred", "predicted_tokens_seconds"):
        assert types["llamacpp:" + name] == "gauge"
    assert values["llamacpp:tokens_predicted_total"] >= 4
    assert "pydflash_draft_tokens_total" in text  # the speculative metrics beside them


def _requests_total(srv: Server) -> dict[str, float]:
    """requests_total by its endpoint label."""
    text = call(srv, "/metrics")[2]
    lines = (line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("pydflash_requests_total{"))
    return {key.split('"')[1]: float(value) for key, value in lines}


def test_one_route_table_each_route_reachable_and_labelled(server):
    seen: set[tuple[str, str]] = set()
    for path, methods in server.routes:
        for method in methods:
            assert (path, method) not in seen, f"{method} {path}: an earlier route answers it"
            seen.add((path, method))
    assert ("/v1/responses", "POST") in seen and ("/slots/{id_slot}", "POST") in seen
    # each request counted under its route's path (a path parameter's route under its template)
    hits = [("/tokenize", {"content": "x"}), ("/props", None), ("/webui/app.js", None), ("/", None),
            ("/v1/responses/input_tokens", {"input": "hi"}), ("/embeddings", {}), ("/slots/0?action=fly", {}),
            ("/no/such/route", None)]
    before = _requests_total(server)
    for path, body in hits:
        call(server, path, body)
    after = _requests_total(server)
    labels = ["/tokenize", "/props", "/webui/app.js", "/", "/v1/responses/input_tokens", "/embeddings",
              "/slots/{id_slot}", "other"]
    assert {k: after[k] - before.get(k, 0.0) for k in labels} == dict.fromkeys(labels, 1.0)


def test_metrics_and_slots_can_be_off(embedded_dflash):
    with Server(embedded_dflash, port=0, metrics=False, slots=False) as srv:
        assert call(srv, "/metrics")[0] == 501
        assert call(srv, "/slots")[0] == 501


def test_a_draft_length_over_the_block_is_clamped(embedded_dflash, caplog):
    caplog.set_level(logging.WARNING)
    top = embedded_dflash.pair.max_draft
    with Server(embedded_dflash, port=0, defaults={"draft_max": top + 50}) as srv:
        assert srv.defaults["draft_max"] == top
        status, _, res = call(srv, "/v1/completions", {"prompt": "def f", "max_tokens": 4, **GREEDY})
        assert status == 200
    assert "draft_max" in caplog.text


# the folder of the pydflash this test imported (site-packages, or src/ with a built _core)
PKG_PATH = str(Path(pydflash.__file__).resolve().parents[1])


def serve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env_path = PKG_PATH
    return subprocess.run([sys.executable, "-m", "pydflash", "serve", "--port", "0", *args], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("args, message", [
    (["--mmproj", "p.gguf"], "--mmproj"),
    (["--embedding"], "--embedding"),
    (["--lora", "x.gguf"], "--lora"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "--chat-template-file"),
], ids=["mmproj", "embedding", "lora", "missing template file"])
def test_flags_that_do_not_apply_are_refused_by_name(args, message):
    out = serve_cli(*args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_serve_help_says_what_is_supported():
    out = subprocess.run([sys.executable, "-m", "pydflash", "serve", "--help"], capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": PKG_PATH})
    for needle in ("/completion", "/tokenize", "/props", "--api-key", "--cors-origins", "--metrics",
                   "Not supported", "embeddings", "-md", "--spec-draft-n-max", "-c", "--temp"):
        assert needle in out.stdout, needle


def test_a_chat_that_cannot_end_is_named_at_start(embedded_dflash, caplog):
    # the embedded pair is a base code model: ChatML's <|im_end|> is no token of its vocabulary,
    # so a chat reply runs until max_tokens or the context is full (issue #49)
    caplog.set_level(logging.WARNING)
    with Server(embedded_dflash, port=0):
        pass
    assert "chat replies will not end by themselves" in caplog.text


def test_several_listen_addresses_share_one_port(embedded_dflash):
    import socket as s
    try:
        with s.socket(s.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with Server(embedded_dflash, port=0, host=["127.0.0.1", "::1"]) as srv:
        for host in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{host}:{srv.port}/health", timeout=30) as r:
                assert r.status == 200


def test_reasoning_off_is_a_server_default(tmp_path):
    import dataclasses

    from pydflash import gguf_writers
    from support.models import TARGET

    spec = dataclasses.replace(TARGET, chat_template=gguf_writers.THINKING_TEMPLATE)
    t = gguf_writers.write_target(tmp_path / "t.gguf", spec)
    msgs = {"messages": [{"role": "user", "content": "hi"}]}
    with Llama(t, n_ctx=256) as llm:
        with Server(llm, port=0) as srv:
            on = call(srv, "/apply-template", msgs)[2]["prompt"]
        with Server(llm, port=0, defaults={"enable_thinking": False}) as srv:  # serve --reasoning off
            off = call(srv, "/apply-template", msgs)[2]["prompt"]
            explicit = call(srv, "/apply-template", {**msgs, "enable_thinking": True})[2]["prompt"]
            # a server default that one kind of request has no field for leaves that kind alone
            status, _, res = call(srv, "/v1/completions", {"prompt": "x", "max_tokens": 2})
            assert status == 200 and res["usage"]["completion_tokens"] == 2, res
    assert on != off and explicit == on
