"""The HTTP request fields reach the generation (top_k, min_p, repeat_penalty,
draft_max: observable effects, equal to the same call in-process), bad values
are 400s, and concurrent requests are queued (observed on /metrics, polled).

A flat-distribution ("spread") tiny pair, so that sampling at temperature 1
differs from greedy and each field changes the output."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from pydflash import Llama
from support.http import post

PROMPT = "x = 1"
# temperature 1 and every other filter off: each test turns one on
# verify="rejection": a seeded request's default (coupled) may keep seed 7's tokens under a field
BASE = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=7, max_tokens=24,
            ignore_eos=True, verify="rejection")


@pytest.fixture(scope="module")
def local(spread_files):
    with Llama(spread_files[0], draft=spread_files[1], n_ctx=1024) as llm:  # the same pair in-process
        yield llm


def complete(server: str, **fields) -> dict:
    status, res = post(server, dict(prompt=PROMPT, **fields))
    assert status == 200, res
    return res


def metrics(server: str) -> dict[str, float]:
    with urllib.request.urlopen(server + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                     if line and not line.startswith("#"))}


@pytest.mark.parametrize("field", [dict(top_k=3), dict(min_p=0.2), dict(repeat_penalty=1.5), dict(typical_p=0.5),
                                   dict(top_n_sigma=2.0)],
                         ids=lambda f: next(iter(f)))
def test_sampling_fields_reach_the_generation(spread_server, local, field):
    got = complete(spread_server, **dict(BASE, **field))["choices"][0]["text"]
    assert got == local.generate(PROMPT, **dict(BASE, **field)).text  # the same pair, seed and field in-process
    assert got != local.generate(PROMPT, **BASE).text  # and the field changed the output


def test_top_k_1_at_temperature_1_is_greedy(spread_server, local):
    greedy = local.generate(PROMPT, max_tokens=24, ignore_eos=True).text
    assert complete(spread_server, **BASE)["choices"][0]["text"] != greedy
    for seed in (1, 2):
        assert complete(spread_server, **dict(BASE, top_k=1, seed=seed))["choices"][0]["text"] == greedy


def test_draft_max_reaches_the_generation(spread_server):
    t0 = complete(spread_server, **dict(BASE, temperature=0, draft_max=0))["timings"]
    assert t0["draft_n"] == 0 and t0["draft_n_accepted"] == 0
    assert t0["n_steps"] == t0["predicted_n"] == 24  # one target pass per token
    r2 = complete(spread_server, **dict(BASE, temperature=0, draft_max=2))
    t2 = r2["timings"]
    assert 0 < t2["draft_n"] <= 2 * t2["n_steps"] and max(r2["speculative"]["accepted_lengths"]) <= 2
    t7 = complete(spread_server, **dict(BASE, temperature=0, draft_max=7))["timings"]
    assert t7["draft_n"] > 2 * t7["n_steps"]  # 7 drafts past 2 per step


@pytest.mark.parametrize("field, match", [
    (dict(top_k="3"), "top_k"), (dict(top_k=True), "top_k"), (dict(top_k=-1), "top_k"),
    (dict(min_p="high"), "min_p"), (dict(min_p=1.5), "min_p"),
    (dict(repeat_penalty=[1]), "repeat_penalty"), (dict(repeat_penalty=-1.0), "repeat_penalty"),
    (dict(draft_max=-1), "draft_max"), (dict(draft_max=8), "draft_max=8 exceeds"), (dict(draft_max=1.5), "draft_max"),
    (dict(typical_p=0), "typical_p"), (dict(top_n_sigma="2"), "top_n_sigma"),
    # samplers without one distribution per position are refused by name
    (dict(mirostat=2), "'mirostat' sampler is not supported"), (dict(xtc_probability=0.5), "'xtc_probability'"),
    (dict(dry_multiplier=0.8), "'dry_multiplier'"), (dict(dynatemp_range=0.5), "'dynatemp_range'"),
], ids=lambda x: json.dumps(x) if isinstance(x, dict) else None)
def test_bad_field_values_are_400(spread_server, field, match):
    status, res = post(spread_server, dict(prompt=PROMPT, max_tokens=2, **field))
    assert status == 400, res
    assert match in res["error"]["message"]
    status, res = post(spread_server, dict(messages=[{"role": "user", "content": "hi"}], max_tokens=2, **field),
                       "/v1/chat/completions")
    assert status == 400 and match in res["error"]["message"], res


def _poll(server: str, what: str, until, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(server)
        if until(m):
            return m
        time.sleep(0.005)
    raise AssertionError(f"{what}: {metrics(server)}")


def test_concurrent_requests_are_served_one_after_the_other(spread_server, local):
    # A runs long; B arrives while A runs and waits (deferred) until A is done
    before = metrics(spread_server)
    done: dict[str, tuple[float, dict]] = {}

    def run(name: str, body: dict) -> None:
        res = complete(spread_server, **body)
        done[name] = (time.monotonic(), res)

    a = threading.Thread(target=run, args=("a", dict(BASE, temperature=0, max_tokens=250)))
    a.start()
    _poll(spread_server, "A never ran", lambda m: m["pydflash_requests_processing"] == 1)
    b = threading.Thread(target=run, args=("b", dict(BASE, temperature=0, max_tokens=8)))
    b.start()
    seen = _poll(spread_server, "B was not queued behind A",
                 lambda m: m["pydflash_requests_deferred"] == 1 or "a" in done)
    assert "a" not in done, "A ended before B was seen waiting: make A longer"
    assert seen["pydflash_requests_processing"] == 1  # A still runs, alone
    a.join(timeout=300)
    b.join(timeout=300)
    (ta, ra), (tb, rb) = done["a"], done["b"]
    # B finished after A although it is ~100x shorter (the client threads note the two
    # ends within a moment of each other: B's 8 tokens take about a millisecond)
    assert tb >= ta - 0.002
    assert ra["usage"]["completion_tokens"] == 250 and rb["usage"]["completion_tokens"] == 8
    assert rb["choices"][0]["text"] == local.generate(PROMPT, max_tokens=8, ignore_eos=True).text
    after = metrics(spread_server)
    assert after["pydflash_requests_processing"] == 0 and after["pydflash_requests_deferred"] == 0
    assert after["pydflash_tokens_predicted_total"] - before["pydflash_tokens_predicted_total"] == 258


# llama-server's repeat_last_n on its native /completion (issue 61: accepted and echoed
# in generation_settings, never passed on): the window the repeat penalty looks at
PENALISED = dict(prompt=PROMPT, temperature=0, repeat_penalty=2.0, n_predict=40, ignore_eos=True)


def test_repeat_last_n_reaches_the_generation_on_completion(spread_server, local):
    def native(last_n: int) -> dict:
        status, res = post(spread_server, dict(PENALISED, repeat_last_n=last_n), "/completion")
        assert status == 200, res
        if last_n >= 0:
            assert res["generation_settings"]["repeat_last_n"] == last_n
        return res

    def lib(last_n: int) -> str:
        return local.generate(PROMPT, max_tokens=40, temperature=0, repeat_penalty=2.0, penalty_last_n=last_n,
                              ignore_eos=True).text

    short, window = native(1)["content"], native(64)["content"]
    assert short != window  # the window changed the output
    assert short == lib(1) and native(2)["content"] == lib(2) and window == lib(64)
    # -1: the slot's context, as llama.cpp's -1 (echoed as the window it became)
    whole = native(-1)
    n_ctx = whole["generation_settings"]["repeat_last_n"]
    assert n_ctx == local.n_ctx_slot and whole["content"] == lib(n_ctx)
    status, res = post(spread_server, dict(PENALISED, repeat_last_n=-2), "/completion")
    assert status == 400 and "repeat_last_n" in res["error"]["message"], res


@pytest.mark.parametrize("field", [dict(mirostat=2), dict(xtc_probability=0.5), dict(dry_multiplier=0.8),
                                   dict(dynatemp_range=0.5), dict(adaptive_target=0.5)],
                         ids=lambda f: next(iter(f)))
def test_a_refused_sampler_has_one_message_on_every_endpoint(spread_server, field):
    name = next(iter(field))
    bodies = {"/v1/completions": dict(prompt=PROMPT), "/completion": dict(prompt=PROMPT),
              "/v1/chat/completions": dict(messages=[{"role": "user", "content": "hi"}])}
    errors = []
    for path, body in bodies.items():
        status, res = post(spread_server, dict(body, max_tokens=2, **field), path)
        assert status == 400 and res["error"]["param"] == name, (path, res)
        errors.append(res["error"]["message"])
    assert f"'{name}' sampler is not supported" in errors[0] and errors == [errors[0]] * len(errors)
