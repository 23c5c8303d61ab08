"""``pydflash serve`` as users run it (a subprocess on 127.0.0.1), driven with
the real ``openai`` client: completions and chat, streaming and not, several
concurrent clients, /metrics consistent with the responses, disconnects."""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pydflash import Llama, gguf_writers
from support.http import get, metrics, serve
from support.models import TARGET

openai = pytest.importorskip("openai")

MSGS = [{"role": "user", "content": "def f():"}]


@pytest.fixture(scope="module")
def pair(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("srv")
    t = gguf_writers.write_target(d / "target-chat.gguf",
                             dataclasses.replace(TARGET, chat_template=gguf_writers.THINKING_TEMPLATE))
    return t, model_dir / "drafter-b8.gguf"


@pytest.fixture(scope="module")
def server(pair):
    t, d = pair
    with serve("-m", str(t), "-d", str(d), "--n-ctx", "1024", "--alias", "tiny-pair") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=120) as c:
        yield c  # closed: its pooled sockets would warn wherever the collector finds them


@pytest.fixture(scope="module")
def local(pair):
    with Llama(pair[0], n_ctx=1024) as llm:  # the target alone: what greedy DFlash must reproduce
        yield llm


def test_health_and_models(server, client):
    assert get(server + "/health") == (200, '{"status": "ok"}')
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-pair"]
    assert get(server + "/nope")[0] == 404


def test_completion(client, local):
    want = local.generate("x = 1", max_tokens=16, ignore_eos=True)
    # whole blocks pinned: on this compute-bound tiny pair the adaptive length may rightly draft
    # nothing (seen: draft_n 0 once generate() stopped waking its reader per step)
    res = client.completions.create(model="tiny-pair", prompt="x = 1", max_tokens=16, temperature=0,
                                    extra_body={"ignore_eos": True, "draft_max": 7})
    assert res.choices[0].text == want.text
    assert res.choices[0].finish_reason == "length"
    assert res.usage.completion_tokens == 16 and res.usage.prompt_tokens == want.stats.prompt_tokens
    timings = res.to_dict()["timings"]
    assert timings["draft_n"] > 0 and 0 <= timings["draft_n_accepted"] <= timings["draft_n"]


def test_cache_prompt_and_id_slot(client):
    # llama-server's request fields: the second identical prompt comes from the cache
    # unless cache_prompt is false; the one slot is id_slot 0 (or -1: any)
    def timings(**extra):
        res = client.completions.create(model="tiny-pair", prompt="import os\nimport sys\n", max_tokens=3,
                                        temperature=0, extra_body=extra)
        return res.to_dict()["timings"]

    timings(cache_prompt=False)
    assert timings(id_slot=0)["cache_n"] > 0
    assert timings(cache_prompt=False, id_slot=-1)["cache_n"] == 0
    with pytest.raises(openai.BadRequestError, match="id_slot"):
        timings(id_slot=3)
    with pytest.raises(openai.BadRequestError, match="cache_prompt"):
        timings(cache_prompt="yes")


def test_metrics_count_prompt_cache_hits_and_the_queue(server, client):
    before = metrics(server)
    t = [client.completions.create(model="tiny-pair", prompt="import os\nimport sys\n", max_tokens=3, temperature=0)
         .to_dict()["timings"] for _ in range(2)]
    after = metrics(server)
    assert t[1]["cache_n"] > 0  # the second prompt comes from the cache
    assert (after["pydflash_prompt_tokens_cached_total"] - before["pydflash_prompt_tokens_cached_total"]
            == t[0]["cache_n"] + t[1]["cache_n"])
    assert (after["pydflash_prompt_cache_hits_total"] - before["pydflash_prompt_cache_hits_total"]
            == (t[0]["cache_n"] > 0) + (t[1]["cache_n"] > 0))
    assert after["pydflash_parallel_slots"] == 1 and after["pydflash_requests_in_flight"] == 0
    assert after["pydflash_requests_rejected_total"] == 0


def test_completion_stream(client, local):
    want = local.generate("def f():", max_tokens=24, ignore_eos=True)
    chunks = list(client.completions.create(model="tiny-pair", prompt="def f():", max_tokens=24, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 24


def test_chat(client, local):
    prompt = local.apply_chat_template(MSGS).prompt
    want = local.generate(prompt, max_tokens=20, ignore_eos=True)
    res = client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=20, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].message.content == want.text
    assert res.usage.prompt_tokens == want.stats.prompt_tokens
    stream = client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=20, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_thinking_off_changes_the_prompt(client, local):
    off = client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=4, temperature=0,
                                         extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                                     "ignore_eos": True})
    on = client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
    suffix = len(local.tokenize("<think>\n\n</think>\n\n"))
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + suffix


def test_metrics_follow_the_responses(server, client):
    before = metrics(server)
    res = client.completions.create(model="tiny-pair", prompt="import os", max_tokens=32, temperature=0,
                                    extra_body={"ignore_eos": True})
    chunks = list(client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=12, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    after = metrics(server)
    t1, t2 = res.to_dict()["timings"], chunks[-1].to_dict()["timings"]
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    assert d["pydflash_draft_tokens_total"] == t1["draft_n"] + t2["draft_n"]
    assert d["pydflash_draft_tokens_accepted_total"] == t1["draft_n_accepted"] + t2["draft_n_accepted"]
    assert d["pydflash_tokens_predicted_total"] == 32 + 12
    assert d["pydflash_target_passes_total"] == t1["n_steps"] + t2["n_steps"]
    assert d['pydflash_accepted_length_bucket{le="+Inf"}'] == t1["n_steps"] + t2["n_steps"]
    assert d["pydflash_accepted_length_sum"] == t1["draft_n_accepted"] + t2["draft_n_accepted"]
    assert after["pydflash_draft_acceptance_rate"] == pytest.approx(
        after["pydflash_draft_tokens_accepted_total"] / after["pydflash_draft_tokens_total"])
    assert after["pydflash_predicted_tokens_seconds"] > 0
    assert after['pydflash_requests_total{endpoint="/v1/completions"}'] >= 1
    _, text = get(server + "/metrics")
    assert "# TYPE pydflash_accepted_length histogram" in text


def test_concurrent_clients_are_queued(server, client, local):
    prompts = ["def f():", "x = 1", "import os", "class A:"]
    want = {p: local.generate(p, max_tokens=16, ignore_eos=True).text for p in prompts}

    def one(i: int) -> tuple[str, str]:
        p = prompts[i % len(prompts)]
        with openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=120) as c:
            if i % 2:
                text = "".join(ch.choices[0].text for ch in c.completions.create(
                    model="tiny-pair", prompt=p, max_tokens=16, temperature=0, stream=True,
                    extra_body={"ignore_eos": True}))
            else:
                text = c.completions.create(model="tiny-pair", prompt=p, max_tokens=16, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text
        return p, text

    with ThreadPoolExecutor(max_workers=6) as ex:
        results = list(ex.map(one, range(12), timeout=180))
    assert len(results) == 12
    for p, text in results:
        assert text == want[p]
    # a reply can reach its client before the server counts its request done
    deadline = time.monotonic() + 10
    while (m := metrics(server))["pydflash_requests_processing"] or m["pydflash_requests_deferred"]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert m["pydflash_requests_processing"] == 0 and m["pydflash_requests_deferred"] == 0


def _wait_cancelled(server: str, n: float) -> dict[str, float]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["pydflash_requests_cancelled_total"] >= n and m["pydflash_requests_processing"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"not cancelled: {metrics(server)}")


def _wait_processing(server: str, predicted_before: float) -> None:
    """Until the server's queue says a generation runs (state polled, no fixed
    sleep); fails if it ended first (nothing would be left to cancel)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["pydflash_requests_processing"] == 1:
            return
        assert m["pydflash_tokens_predicted_total"] == predicted_before, "the generation ended before the disconnect"
        time.sleep(0.005)
    raise AssertionError(f"the generation never started: {metrics(server)}")


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_cancels_the_generation(server, client, stream):
    before = metrics(server)
    host, port = server.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "def f():", "max_tokens": 1000, "temperature": 0, "ignore_eos": True,
                       "stream": stream}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            got = b""
            while b"data: " not in got:  # the generation is running
                data = sock.recv(4096)
                assert data, got
                got += data
            assert got.startswith(b"HTTP/1.1 200")
        else:
            _wait_processing(server, before["pydflash_tokens_predicted_total"])  # the generation is running
        sock.shutdown(socket.SHUT_RDWR)
    after = _wait_cancelled(server, before["pydflash_requests_cancelled_total"] + 1)
    # the generation stopped early: far fewer than 1000 tokens were counted, and the pair serves again
    assert after["pydflash_tokens_predicted_total"] - before["pydflash_tokens_predicted_total"] < 1000
    res = client.completions.create(model="tiny-pair", prompt="x", max_tokens=4, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert res.usage.completion_tokens == 4


def test_bad_requests_are_400(server, client):
    with pytest.raises(openai.BadRequestError, match="messages"):  # ([] is answered, as llama-server does)
        client.chat.completions.create(model="tiny-pair", messages="hi", max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="'n' must be in"):
        client.completions.create(model="tiny-pair", prompt="x", max_tokens=4, n=17)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tiny-pair", prompt="x", max_tokens=4, extra_body={"temperature": "hot"})
    with pytest.raises(openai.BadRequestError, match="response_format type must be"):
        client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=4,
                                       extra_body={"response_format": {"type": "xml"}})
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model="tiny-pair", messages=[{"content": "x"}], max_tokens=4)
    host, port = server.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", body=b"{not json", headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 400 and "not valid JSON" in json.loads(r.read())["error"]["message"]
    conn.close()
    # still serving
    assert client.completions.create(model="tiny-pair", prompt="x", max_tokens=2, temperature=0,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens == 2


def test_draft_controls_are_request_fields(client):
    # draft_min / draft_p_min reach the generation: draft_min=100 drops every block,
    # draft_p_min=1 cuts blocks where the (very peaked) random drafter is not certain
    # (on "x = 1"; it is certain throughout the chat prompt); a bad value is a 400 naming the field
    def draft_n(chat=False, **extra):
        extra = {"ignore_eos": True, "draft_max": 7, **extra}  # cuts of the whole block
        if chat:
            res = client.chat.completions.create(model="tiny-pair", messages=MSGS, max_tokens=16, temperature=0,
                                                 extra_body=extra)
        else:
            res = client.completions.create(model="tiny-pair", prompt="x = 1", max_tokens=16, temperature=0,
                                            extra_body=extra)
        return res.to_dict()["timings"]["draft_n"]

    full = draft_n()
    assert draft_n(draft_min=100) == 0 < full
    assert draft_n(draft_p_min=1) < full
    assert draft_n(chat=True, draft_min=100) == 0 < draft_n(chat=True)
    with pytest.raises(openai.BadRequestError, match="draft_p_min"):
        draft_n(draft_p_min=1.5)
    with pytest.raises(openai.BadRequestError, match="draft_min"):
        draft_n(draft_min="many")


def test_serve_help():
    out = subprocess.run([sys.executable, "-m", "pydflash", "serve", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "usage: pydflash serve" in out
    for flag in ("-m TARGET", "-d DRAFT", "--host", "--port", "/metrics", "--chat-template"):
        assert flag in out
