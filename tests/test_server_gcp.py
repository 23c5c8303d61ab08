"""llama-server's Google Cloud Vertex AI mode (``AIP_MODE=PREDICTION``): the predict
route runs each instance through the route its ``@requestFormat`` names, and
``AIP_HEALTH_ROUTE`` answers as /health. Without AIP_MODE there is no predict route."""

from __future__ import annotations

import pytest

from pydflash import Llama
from pydflash.server import Server
from pydflash.server.gcp import gcp_alias
from support.http import get, post


@pytest.fixture(scope="module")
def llm(spread_files):
    t, d = spread_files
    with Llama(t, draft=d, n_ctx=512) as llm:
        yield llm


@pytest.fixture
def gcp_server(llm, monkeypatch):
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "0")  # wins over port=: 0 picks a free one
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "vertex/predict")  # a leading slash is added
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/vertex/health")
    with Server(llm, port=1) as srv:
        yield srv.url


def test_aliases_are_llama_servers():
    assert gcp_alias("/v1/chat/completions") == "chatCompletions"
    assert gcp_alias("/apply-template") == "applyTemplate"
    assert gcp_alias("/slots/{id_slot}") == "slots"


def test_each_instance_runs_through_its_route(gcp_server):
    chat = {"@requestFormat": "chatCompletions", "max_tokens": 3, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    instances = [chat, {"@requestFormat": "/tokenize", "content": "hi"}, {"@requestFormat": "nope"}, 7]
    status, body = post(gcp_server, {"instances": instances}, "/vertex/predict")
    assert status == 200
    first, tokens, unknown, bad = body["predictions"]
    assert first["object"] == "chat.completion" and first["usage"]["completion_tokens"] == 3  # stream: false
    assert isinstance(tokens["tokens"], list) and tokens["tokens"]
    assert unknown["error"]["code"] == 400 and "nope" in unknown["error"]["message"]
    assert bad["error"]["message"] == "each instance must be a JSON object"
    assert get(gcp_server + "/vertex/health")[0] == 200


def test_a_body_without_instances_is_refused(gcp_server):
    status, body = post(gcp_server, {"instance": []}, "/vertex/predict")
    assert status == 400 and "instances" in body["error"]["message"]
    status, body = post(gcp_server, {"instances": [{}] * 129}, "/vertex/predict")
    assert status == 400 and "128" in body["error"]["message"]


def test_no_predict_route_without_aip_mode(llm, monkeypatch):
    monkeypatch.delenv("AIP_MODE", raising=False)
    with Server(llm, port=0) as srv:
        assert post(srv.url, {"instances": []}, "/predict")[0] == 404
