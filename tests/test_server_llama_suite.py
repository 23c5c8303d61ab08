"""What llama.cpp's own server suite (issue #48) checks of the native completion:
the JSON prompt object, prompts as token lists mixed with texts, ignore_eos's EOG
biases in ``generation_settings``, the timings' decode rate (the first token costs no
decode step) and numbers, ``timings_per_token``, ``include_usage``, the ``verbose``
debug field and the streams recorded under ``X-Conversation-Id``. A real server on
127.0.0.1 (the embedded pair, in this process)."""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request

import pytest

from pydflash import Llama
from pydflash.server import Server
from support.raw_http import events

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama):
    srv = Server(embedded_dflash, port=0, metrics=True).start()
    yield srv
    srv.shutdown()


def call(srv: Server, path: str, data: dict) -> tuple[int, object]:
    req = urllib.request.Request(srv.url + path, json.dumps(data).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            body = r.read()
            return r.status, events(body) if data.get("stream") else json.loads(body)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_json_prompt_object_is_its_prompt_string(server):
    status, plain = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 4, **GREEDY})
    assert status == 200
    status, res = call(server, "/completion", {"prompt": {"prompt_string": "def f(x):"}, "n_predict": 4, **GREEDY})
    assert status == 200, res
    assert res["content"] == plain["content"] and res["tokens_evaluated"] == plain["tokens_evaluated"]
    # media with it: the model has no multimodal input
    media = {"prompt_string": "x <__media__>", "multimodal_data": ["AA=="]}
    status, res = call(server, "/completion", {"prompt": media})
    assert status == 400 and "multimodal" in res["error"]["message"]
    status, res = call(server, "/completion", {"prompt": {"text": "no prompt_string"}})
    assert status == 400


def test_prompts_of_token_lists_texts_and_objects(server, embedded_dflash):
    text = "def f(x):"
    ids = embedded_dflash.tokenize(text)
    status, one = call(server, "/completion", {"prompt": ids, "n_predict": 4, **GREEDY})
    assert status == 200
    for prompts in ([ids, ids], [ids, text], [ids, {"prompt_string": text}]):
        status, many = call(server, "/completion", {"prompt": prompts, "n_predict": 4, **GREEDY})
        assert status == 200, many
        assert [r["content"] for r in many] == [one["content"]] * 2 and [r["index"] for r in many] == [0, 1]
    status, res = call(server, "/completion", {"prompt": [1, 2, text, 3, text], "n_predict": 2, **GREEDY})
    assert status == 200 and isinstance(res["content"], str)


def test_ignore_eos_shows_the_eog_biases(server, embedded_dflash):
    status, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 2, "ignore_eos": True})
    assert status == 200
    bias = res["generation_settings"]["logit_bias"]
    eog = {t for t in range(embedded_dflash.n_vocab()) if embedded_dflash.core_model.is_eog(t)}
    assert {b["token"] for b in bias} == eog and all(b["bias"] is None for b in bias)  # -inf is null in JSON
    status, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 2, "logit_bias": [[5, 1.5]]})
    assert res["generation_settings"]["logit_bias"] == [{"token": 5, "bias": 1.5}]


def test_the_decode_rate_leaves_out_the_first_token(server):
    _, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 1, **GREEDY})
    t = res["timings"]
    assert t["predicted_n"] == 1 and t["predicted_per_second"] == 0.0 and t["predicted_per_token_ms"] == 0.0
    _, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": 12, **GREEDY})
    t = res["timings"]
    assert t["predicted_n"] == 12
    assert math.isclose(t["predicted_per_second"], 1e3 / t["predicted_ms"] * 11)
    assert math.isclose(t["predicted_per_token_ms"], t["predicted_ms"] / 11)


@pytest.mark.parametrize("n_predict", [1, 8])
def test_timings_hold_numbers_and_the_step_counts_sit_beside_them(server, n_predict):
    _, res = call(server, "/completion", {"prompt": "def f(x):", "n_predict": n_predict, **GREEDY})
    t, spec = res["timings"], res["speculative"]
    assert all(isinstance(v, (int, float)) and v >= 0 for v in t.values()), t  # llama-server's clients compare them
    assert t["prompt_ms"] > 0 and t["prompt_per_token_ms"] > 0
    assert len(spec["accepted_lengths"]) == t["n_steps"] and sum(spec["accepted_lengths"]) == t["draft_n_accepted"]
    assert sum(s["draft_n"] for s in spec["draft_sources"].values()) == t["draft_n"]


def test_timings_per_token_times_each_chunk(server):
    prompt = "the quick brown fox jumps over the lazy dog " * 8  # several chunks of -b tokens
    body = {"prompt": prompt, "n_predict": 4, "stream": True, "timings_per_token": True, "return_progress": True}
    status, evs = call(server, "/completion", body)
    assert status == 200
    progress = [e for e in evs if "prompt_progress" in e]
    assert len(progress) > 1
    first = progress[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0 and first["predicted_n"] == 0
    assert all("timings" in e for e in evs)
    prompt_ms = [e["timings"]["prompt_ms"] for e in progress]
    assert prompt_ms == sorted(prompt_ms) and prompt_ms[-1] > 0
    done = [e["timings"]["predicted_n"] for e in evs if e["tokens"]]
    assert done == sorted(done) and done[-1] == 4 and evs[-1]["timings"]["predicted_n"] == 4
    assert "speculative" not in evs[0] and "speculative" in evs[-1]
    # without it, only the last chunk has them
    _, evs = call(server, "/completion", dict(body, timings_per_token=False))
    assert [i for i, e in enumerate(evs) if "timings" in e] == [len(evs) - 1]


def test_a_chat_stream_with_include_usage_ends_with_a_usage_chunk(server):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
        "timings_per_token": True,
        **GREEDY,
    }
    status, evs = call(server, "/v1/chat/completions", body)
    assert status == 200 and evs[-1] == "[DONE]"
    *chunks, usage = evs[:-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert usage["timings"]["predicted_n"] == 4 and "speculative" in usage
    assert "timings" not in chunks[0] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("timings" in c for c in chunks[1:] if c["choices"][0]["delta"].get("content"))
    assert all("usage" not in c for c in chunks)


def test_the_metrics_count_a_timed_stream_once(server):
    def generated() -> float:
        with urllib.request.urlopen(server.url + "/metrics", timeout=60) as r:
            line = next(x for x in r.read().decode().splitlines() if x.startswith("llamacpp:tokens_predicted_total"))
        return float(line.split()[-1])

    before = generated()
    call(server, "/completion", {"prompt": "def f(x):", "n_predict": 6, "stream": True, "timings_per_token": True})
    assert generated() - before == 6


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_verbose_adds_the_native_view(server, embedded_dflash, path):
    if path == "/v1/chat/completions":
        messages = [{"role": "system", "content": "Book"}, {"role": "user", "content": "the best book"}]
        body: dict = {"messages": messages}
        want = embedded_dflash.apply_chat_template(messages).prompt
    else:
        body = {"prompt": "def f(x):"}
        want = "def f(x):"
    for verbose in (True, False):
        status, res = call(server, path, {**body, "max_tokens": 3, "verbose": verbose, **GREEDY})
        assert status == 200
        if not verbose:
            assert "__verbose" not in res
            continue
        v = res["__verbose"]
        assert want in v["prompt"] and v["tokens_evaluated"] == res["usage"]["prompt_tokens"]
        choice = res["choices"][0]
        assert v["content"] == choice.get("text", (choice.get("message") or {}).get("content"))
        assert v["tokens_predicted"] == 3 and v["timings"] == res["timings"]


CONV = "conv-1::org/model:Q8_0"  # a model name with a slash: the id travels in the query string
QS = "conv_id=" + urllib.parse.quote(CONV, safe="")


def request(srv: Server, method: str, path: str, data: dict | None = None, headers: dict | None = None):
    raw = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(
        srv.url + path, raw, {"Content-Type": "application/json", **(headers or {})}, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_conversation_stream_is_replayed_and_stopped(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True, **GREEDY}
    status, sent = request(server, "POST", "/v1/chat/completions", chat, {"X-Conversation-Id": CONV})
    assert status == 200 and sent.endswith(b"data: [DONE]\n\n")
    status, again = request(server, "GET", f"/v1/stream?{QS}&from=0")
    assert status == 200 and again == sent
    status, tail = request(server, "GET", f"/v1/stream?{QS}&from=10")
    assert tail == sent[10:]
    status, found = request(server, "POST", "/v1/streams/lookup", {"conversation_ids": ["conv-1", "other"]})
    [entry] = json.loads(found)
    assert entry["conversation_id"] == CONV and entry["is_done"] and entry["total_bytes"] == len(sent)
    assert request(server, "GET", f"/v1/stream?{QS}&from=x")[0] == 400
    assert request(server, "GET", "/v1/stream")[0] == 400
    assert request(server, "DELETE", f"/v1/stream?{QS}")[0] == 204
    assert request(server, "GET", f"/v1/stream?{QS}&from=0")[0] == 404
    assert request(server, "DELETE", f"/v1/stream?{QS}")[0] == 204  # idempotent


def test_a_conversation_stream_goes_on_when_its_client_leaves(server):
    body = json.dumps({"prompt": "def f(x):", "n_predict": 300, "stream": True, **GREEDY})
    conn = http.client.HTTPConnection(server.host, server.port, timeout=300)
    conn.request("POST", "/completion", body, {"Content-Type": "application/json", "X-Conversation-Id": "left"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.read1(10)  # the first bytes, then the client leaves
    conn.close()
    _, replay = request(server, "GET", "/v1/stream?conv_id=left&from=0")
    evs = events(replay)
    assert evs[-1]["stop"] is True and evs[-1]["tokens_predicted"] == 300  # the generation ran to its end
