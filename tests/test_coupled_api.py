"""verify="coupled" reaches every entry point (issue #52): stream, submit, the
completions, and the server's ``"verify"`` request field; each gives the target
alone's text for the seed. The spread pair and its server (tests/conftest.py)."""

from __future__ import annotations

import pytest

from pydflash import Llama
from support.http import post

OPTS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7, max_tokens=24, ignore_eos=True)
PROMPT = "x = 1"


@pytest.fixture(scope="module")
def pair(spread_files):
    t, d = spread_files
    with Llama(t, n_ctx=512, n_threads=1) as alone, Llama(t, draft=d, n_ctx=512, draft_max=4, n_threads=1) as llm:
        yield alone, llm


def test_generate_stream_and_submit_give_the_target_alone_text(pair):
    alone, llm = pair
    kw = {k: v for k, v in OPTS.items() if k != "max_tokens"}
    want = alone.generate(PROMPT, 24, verify="coupled", **kw)
    for seed in (7, 8):  # and seeds differ (the spread target samples widely)
        assert llm.generate(PROMPT, 24, verify="coupled", **{**kw, "seed": seed}).tokens == alone.generate(
            PROMPT, 24, verify="coupled", **{**kw, "seed": seed}).tokens
    assert alone.generate(PROMPT, 24, verify="coupled", **{**kw, "seed": 8}).tokens != want.tokens
    assert [t for s in llm.stream(PROMPT, 24, verify="coupled", **kw) for t in s.tokens] == want.tokens
    assert llm.submit(PROMPT, 24, verify="coupled", **kw).result().tokens == want.tokens
    assert sum(s.n_drafted for s in llm.generate(PROMPT, 24, verify="coupled", **kw).stats.steps) > 0


def test_completions_take_verify(pair):
    alone, llm = pair
    want = alone.create_completion(PROMPT, verify="coupled", **OPTS)["choices"][0]["text"]
    assert llm.create_completion(PROMPT, verify="coupled", **OPTS)["choices"][0]["text"] == want
    with pytest.raises(ValueError, match="verify must be one of 'rejection', 'match', 'coupled'"):
        llm.create_completion(PROMPT, verify="exact", **OPTS)


def test_the_server_takes_verify(spread_server, pair):
    alone, _ = pair
    want = alone.create_completion(PROMPT, verify="coupled", **OPTS)["choices"][0]["text"]
    status, body = post(spread_server, {"prompt": PROMPT, "verify": "coupled", **OPTS})
    assert status == 200 and body["choices"][0]["text"] == want
    status, body = post(spread_server, {"prompt": PROMPT, "verify": "exact", **OPTS})
    assert status == 400 and "verify" in json_text(body)


def json_text(body: dict) -> str:
    import json

    return json.dumps(body)
