"""`pydflash bench --serving`, kept tiny: the client's token and latency
accounting (on event lists, then against a real `pydflash serve` of the
embedded pair on 127.0.0.1), the percentiles, the servers' start and stop,
the CLI and its JSON. The figures are not checked (benchmarks report, tests
do not time). The side-by-side run with llama-server is skipped where the
binary is not built (python tools/build_native.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pydflash import embedded_pair
from pydflash.bench import servers, serving, serving_report
from pydflash.bench.engines import EngineUnavailable, find_llama_server
from pydflash.bench.serving_report import percentile
from pydflash.bench.sse_client import record_from_events, stream_completion, token_counts
from pydflash.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "build" / "native" / "bin" / "llama-server"  # tools/build_native.py; tests may run elsewhere
LLAMA_SERVER = str(BUILT) if BUILT.is_file() else find_llama_server(None)

SWEEP_KEYS = {"workload", "engine", "concurrency", "isl", "osl", "repeats", "requests", "output_tok_s",
              "output_tok_s_min", "output_tok_s_max", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
              "request_tok_s_p50", "decode_tok_s_p50", "tokens_per_delivery", "acceptance_rate", "all_osl_tokens",
              "token_counts"}
TURN_KEYS = {"workload", "engine", "turn", "repeats", "prompt_tokens", "cache_n", "prompt_n", "ttft_ms",
             "ttft_ms_min", "ttft_ms_max"}
TINY = ["--pad-ffn", "0", "--requests", "1", "--repeats", "1", "--warmup", "0", "--isl", "24", "--osl", "8",
        "--history", "64", "--turn-tokens", "8", "--threads", "2"]


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        values = rng.random(n).tolist()
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([], 50) is None
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)


def _chunk(text: str, **extra) -> dict:
    return {"choices": [{"text": text, "index": 0, "finish_reason": None}], **extra}


def test_token_counts_each_way():
    # llama-server with timings_per_token: every event says how many tokens so far
    server = [_chunk("a", timings={"predicted_n": 1}), _chunk("b", timings={"predicted_n": 3}),
              _chunk("", usage={"completion_tokens": 3}, timings={"predicted_n": 3})]
    assert token_counts(server) == ([1, 2, 0], "server")
    # pydflash: one event per step; a step's tokens = its accepted drafts + 1 (the last cut by max_tokens)
    steps = [_chunk("x"), _chunk("yy"), _chunk("zzz"),
             _chunk("", usage={"completion_tokens": 5}, timings={"accepted_lengths": [0, 1, 4]})]
    assert token_counts(steps) == ([1, 2, 2, 0], "steps")
    # a step whose text was held back: events and steps no longer line up
    held = [_chunk("x"), _chunk("yyyy"), _chunk("", usage={"completion_tokens": 7},
                                               timings={"accepted_lengths": [0, 1, 2]})]
    assert token_counts(held) == ([3, 4, 0], "even")


def test_one_step_counts_alike_in_both_event_shapes():
    # a step of 3 tokens 50 ms after the request, then one of 2 tokens 10 ms later: llama-server
    # sends a token per event, the events of one step with the same predicted_ms (however late
    # each arrives), pydflash a step per event; the figures must agree
    t0 = 100.0
    step_ms = [6.7, 6.7, 6.7, 11.8, 11.8]
    per_token = [_chunk(c, timings={"predicted_n": i + 1, "predicted_ms": ms})
                 for i, (c, ms) in enumerate(zip("abcde", step_ms, strict=True))]
    per_token.append(_chunk("", usage={"completion_tokens": 5}, timings={"predicted_n": 5, "predicted_ms": 11.8}))
    token_times = [t0 + 0.050, t0 + 0.0503, t0 + 0.052, t0 + 0.060, t0 + 0.063, t0 + 0.0631]
    per_step = [_chunk("abc"), _chunk("de"),
                _chunk("", usage={"completion_tokens": 5}, timings={"accepted_lengths": [2, 1]})]
    step_times = [t0 + 0.050, t0 + 0.060, t0 + 0.0602]
    a = record_from_events(t0, t0 + 0.064, token_times, per_token)
    b = record_from_events(t0, t0 + 0.064, step_times, per_step)
    for rec in (a, b):
        assert [d.n_tokens for d in rec.deliveries] == [3, 2] and rec.text == "abcde"
        assert rec.ttft_s == pytest.approx(0.050)
        assert rec.itl_s == pytest.approx([0.005, 0.005])  # a 10 ms gap shared by the 2 tokens after it
        assert rec.decode_tok_s == pytest.approx(2 / 0.010)
        assert rec.e2e_s == pytest.approx(0.060)  # a delivery counts from its first event


@pytest.fixture(scope="module")
def settings():
    target, draft = embedded_pair()
    return dict(target=str(target), draft=str(draft), threads=2, flash_attn="auto", draft_max=7,
                n_ctx_per_slot=512, llama_server=LLAMA_SERVER)


def test_client_against_pydflash_serve(settings, tmp_path):
    log = tmp_path / "pydflash.log"
    with servers.ServerProcess(servers.PYDFLASH, settings, 1, log) as srv:
        body = {"prompt": "def parse(text):\n", "max_tokens": 24, "temperature": 0.0, "ignore_eos": True}
        rec = stream_completion(srv.url, body)
        assert rec.n_tokens == rec.usage["completion_tokens"] == 24
        assert rec.token_counts == "steps"  # ASCII code: every step's text comes out at once
        assert len(rec.deliveries) == rec.timings["n_steps"]
        assert len(rec.itl_s) == 24 - rec.deliveries[0].n_tokens
        assert 0 < rec.ttft_s < rec.e2e_s and rec.timings["draft_n"] > 0
        prompts = ["def a(x):\n", "class B:\n", "import os\n", "x = [\n"]
        wall_s, records = serving.run_streams(srv.url, prompts, 2, 2, 8)
        assert [r.usage["prompt_tokens"] for r in records] == prompt_lengths(prompts)
        assert all(r.n_tokens == 8 for r in records) and wall_s >= max(r.e2e_s for r in records)
        turns = serving.converse(srv.url, "def f(a, b):\n    return a + b\n", ["def g(x):"], 8)
        assert turns[1].timings["cache_n"] > 0
        assert turns[1].timings["cache_n"] + turns[1].timings["prompt_n"] == turns[1].usage["prompt_tokens"]
        proc = srv.proc
    assert proc.poll() is not None  # stopped on leaving the block
    assert log.read_text().startswith("\n$ ") and "pydflash serve" in log.read_text()


def prompt_lengths(texts: list[str]) -> list[int]:
    from pydflash import Llama

    with Llama(embedded_pair()[0], n_ctx=64) as tok:
        return [len(tok.tokenize(t)) for t in texts]


def test_server_start_failures(settings, tmp_path):
    with pytest.raises(EngineUnavailable, match=r"tools/build_native\.py"):
        servers.ServerProcess(servers.LLAMA_SERVER, settings | {"llama_server": None}, 1, tmp_path / "l.log")
    bad = settings | {"target": str(tmp_path / "missing.gguf")}
    with pytest.raises(EngineUnavailable, match="exited"):
        servers.ServerProcess(servers.PYDFLASH, bad, 1, tmp_path / "p.log")


def test_ratios_table_and_outputs():
    def row(engine, **kw):
        base = dict(workload="concurrency", engine=engine, concurrency=2, requests=4, output_tok_s=100.0,
                    output_tok_s_min=90.0, output_tok_s_max=110.0, ttft_ms_p50=20.0, ttft_ms_p99=40.0,
                    itl_ms_p50=5.0, itl_ms_p99=9.0, request_tok_s_p50=80.0, tokens_per_delivery=3.0,
                    acceptance_rate=0.5)
        return base | kw

    turn = dict(workload="multi-turn", turn=2, prompt_tokens=300, cache_n=280, prompt_n=20, ttft_ms=10.0,
                ttft_ms_min=9.0, ttft_ms_max=12.0)
    rows = [row("pydflash-serve", output_tok_s=120.0, itl_ms_p50=4.0), row("llama-server"),
            turn | {"engine": "pydflash-serve", "ttft_ms": 8.0}, turn | {"engine": "llama-server"}]
    entries = serving_report.ratios(rows, {"c2": [4, 4]})
    assert entries[0]["output_tok_s"] == pytest.approx(1.2) and entries[0]["itl_ms_p50"] == pytest.approx(0.8)
    assert entries[0]["same_outputs"] == [4, 4]
    assert entries[1]["ttft_ms"] == pytest.approx(0.8) and entries[1]["cache_n"] == [280, 280]
    lines = serving_report.ratio_lines(entries)
    assert "output tok/s 1.200" in lines[0] and "identical outputs 4/4" in lines[0]
    text = serving_report.table(rows)
    assert text.count("ratio p/l") == 2 and "1.200" in text and "0.800" in text


def test_cli_serving_writes_json(tmp_path, capsys):
    j = tmp_path / "serving.json"
    rc = cli(["bench", "--serving", "--engines", "pydflash-serve", "--concurrency", "1,2", "--turns", "2", *TINY,
              "--json", str(j)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "pydflash-serve" in out and "cache_n" in out
    data = json.loads(j.read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["command_line"].startswith("pydflash bench --serving --engines pydflash-serve")
    assert meta["mode"] == "serving" and meta["ratios"] == [] and meta["skipped"] == {}
    assert isinstance(meta["pydflash_serve_parallel"], bool)
    sweep = [r for r in rows if r["workload"] == "concurrency"]
    assert [(r["concurrency"], r["requests"]) for r in sweep] == [(1, 1), (2, 2)]
    for r in sweep:
        assert set(r) >= SWEEP_KEYS and r["all_osl_tokens"] and r["isl_measured"] == 24
        assert r["output_tok_s_min"] <= r["output_tok_s"] <= r["output_tok_s_max"]
    turns = [r for r in rows if r["workload"] == "multi-turn"]
    assert [r["turn"] for r in turns] == [1, 2] and all(set(r) >= TURN_KEYS for r in turns)
    assert turns[0]["prompt_tokens"] == 64 and turns[1]["cache_n"] > 0
    logs = sorted(p.name for p in Path(meta["log_dir"]).iterdir())
    assert Path(meta["log_dir"]) == tmp_path / "serving-logs"
    assert logs == ["c1-pydflash-serve.log", "c2-pydflash-serve.log", "multi-turn-pydflash-serve.log"]


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "1"], "only with --serving"),
    (["--serving", "--csv", "x.csv"], "not with --serving"),
    (["--serving", "--isl", "16,32"], "give one value with --serving"),
    (["--serving", "--engines", "llama-server"], "serving engines"),
    (["--serving", "--concurrency", "0"], "must be >= 1"),
    (["--serving", "--concurrency", "", "--turns", "0"], "nothing to measure"),
])  # fmt: skip
def test_cli_serving_arguments(args, message, capsys):
    assert cli(["bench", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(LLAMA_SERVER is None, reason="llama-server is not built (python tools/build_native.py)")
def test_side_by_side_with_llama_server(tmp_path, capsys):
    j = tmp_path / "serving.json"
    rc = cli(["bench", "--serving", "--llama-server", str(LLAMA_SERVER), "--concurrency", "1,2", "--turns", "2",
              *TINY, "--json", str(j)])
    assert rc == 0
    assert "ratio p/l" in capsys.readouterr().out
    data = json.loads(j.read_text())
    rows = data["rows"]
    assert {r["engine"] for r in rows} == {"pydflash-serve", "llama-server"}
    for r in rows:
        if r["engine"] == "llama-server" and r["workload"] == "concurrency":
            assert r["token_counts"] == {"server": r["requests"]} and r["all_osl_tokens"]
    ratios = data["meta"]["ratios"]
    assert [(e["workload"], e.get("concurrency", e.get("turn"))) for e in ratios] == [
        ("concurrency", 1), ("concurrency", 2), ("multi-turn", 1), ("multi-turn", 2)]
    llama_turn2 = next(r for r in rows if r["engine"] == "llama-server" and r.get("turn") == 2)
    assert llama_turn2["cache_n"] > 0
