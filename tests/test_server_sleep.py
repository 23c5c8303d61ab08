"""llama-server's --sleep-idle-seconds: an idle server frees its model and the next
request that needs it reloads it; /health, /props, /models and /metrics answer
meanwhile without waking it. Also Llama.sleep()/wake() themselves."""

from __future__ import annotations

import json
import time

import pytest

from pydflash import Llama
from pydflash.errors import PyDFlashError
from pydflash.server import Server
from support.http import get, post, serve

GREEDY = {"prompt": "x = 1", "max_tokens": 6, "temperature": 0, "ignore_eos": True}


def _props(url: str) -> dict:
    status, body = get(url + "/props")
    assert status == 200
    return json.loads(body)


def _wait_asleep(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not _props(url)["is_sleeping"]:
        assert time.monotonic() < deadline, "the server did not fall asleep"
        time.sleep(0.05)


def test_llama_sleeps_and_wakes(spread_files):
    t, d = spread_files
    with Llama(t, draft=d, n_ctx=256) as llm:
        before = llm.create_completion(**GREEDY)["choices"][0]["text"]
        llm.sleep()
        assert llm.sleeping and llm.closed
        with pytest.raises(PyDFlashError):
            llm.tokenize(b"x")
        llm.wake()
        assert not llm.sleeping and llm.create_completion(**GREEDY)["choices"][0]["text"] == before
        llm.sleep()
        llm.close()  # closed for good: nothing to wake
        llm.wake()
        assert llm.closed and not llm.sleeping


def test_an_idle_server_sleeps_and_a_request_wakes_it(spread_files):
    t, d = spread_files
    with Llama(t, draft=d, n_ctx=256) as llm, Server(llm, port=0, sleep_idle_seconds=0.3) as srv:
        status, awake = post(srv.url, GREEDY)
        assert status == 200 and _props(srv.url)["is_sleeping"] is False
        _wait_asleep(srv.url)
        assert llm.sleeping  # the model is freed
        # the read-only endpoints answer from what the server knew as it fell asleep
        assert get(srv.url + "/health")[0] == 200
        status, models = get(srv.url + "/v1/models")
        assert status == 200 and srv.alias in models
        status, text = get(srv.url + "/metrics")
        assert status == 200 and "llamacpp:tokens_predicted_total 6.0" in text
        time.sleep(0.5)  # polling them is no use: the server still sleeps
        assert llm.sleeping and _props(srv.url)["is_sleeping"] is True
        status, res = post(srv.url, GREEDY)  # a generation wakes it, with the same model
        assert status == 200 and res["choices"][0]["text"] == awake["choices"][0]["text"]
        assert _props(srv.url)["is_sleeping"] is False
        _wait_asleep(srv.url)
        status, res = post(srv.url, {"content": "x = 1"}, "/tokenize")  # so does any use of the model
        assert status == 200 and res["tokens"] and not llm.sleeping


def test_the_flag_of_pydflash_serve(spread_files):
    t, d = spread_files
    with serve("-m", str(t), "-d", str(d), "--n-ctx", "256", "--sleep-idle-seconds", "1") as url:
        assert _props(url)["is_sleeping"] is False
        _wait_asleep(url)
        assert post(url, GREEDY)[0] == 200 and _props(url)["is_sleeping"] is False
