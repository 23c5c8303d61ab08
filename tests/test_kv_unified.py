"""``kv_unified`` (llama.cpp's ``--kv-unified``): the ``n_parallel`` sequences share one
KV cache of ``n_ctx`` cells and each may fill all of it; a decode that finds no room
fails every sequence then running, with llama-server's "context size has been
exceeded", and the pair goes on."""

from __future__ import annotations

import json

import pytest

import pydflash
from pydflash import Llama, PyDFlashError
from support.http import get, post, serve

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def unified():
    target, draft = pydflash.embedded_pair()
    with Llama(str(target), str(draft), n_ctx=256, n_parallel=4, kv_unified=True) as llm:
        yield llm


def test_one_sequence_may_use_the_whole_context(unified):
    assert unified.n_ctx_slot == 256
    out = unified.generate(PROMPT, max_tokens=150, ignore_eos=True)
    assert len(out.tokens) == 150 and out.finish_reason == "length"  # past n_ctx / n_parallel = 64


def test_a_full_shared_cache_fails_the_running_sequences_and_the_pair_goes_on(unified):
    with pytest.raises(PyDFlashError, match="context size has been exceeded"):
        unified.generate_batch([PROMPT] * 4, max_tokens=120, ignore_eos=True)  # 4 x 120 > 256 cells
    assert len(unified.generate(PROMPT, max_tokens=100, ignore_eos=True).tokens) == 100


def test_without_it_each_sequence_has_its_share():
    target, draft = pydflash.embedded_pair()
    with Llama(str(target), str(draft), n_ctx=256, n_parallel=4) as llm:
        assert llm.n_ctx_slot == 64
        assert len(llm.generate(PROMPT, max_tokens=150, ignore_eos=True).tokens) < 64


def test_serve_kv_unified_gives_each_slot_the_whole_context():
    with serve("--kv-unified", "-c", "256", "-np", "4") as url:
        status, body = get(url + "/props")
        assert status == 200 and json.loads(body)["default_generation_settings"]["n_ctx"] == 256
        status, res = post(
            url, {"prompt": PROMPT, "n_predict": 100, "temperature": 0, "ignore_eos": True}, "/completion"
        )
        assert status == 200 and res["tokens_predicted"] == 100
