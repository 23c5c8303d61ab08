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
from pydflash.bench.sse_client import Delivery, StreamRecord, record_from_events, stream_completion, token_counts
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
             _chunk("", usage={"completion_tokens": 5}, speculative={"accepted_lengths": [0, 1, 4]})]
    assert token_counts(steps) == ([1, 2, 2, 0], "steps")
    # a step whose text was held back: events and steps no longer line up
    held = [_chunk("x"), _chunk("yyyy"), _chunk("", usage={"completion_tokens": 7},
                                               speculative={"accepted_lengths": [0, 1, 2]})]
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
                _chunk("", usage={"completion_tokens": 5}, speculative={"accepted_lengths": [2, 1]})]
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
    # the draft length pinned: the client test below needs drafted steps from the shipped pair
    return dict(target=str(target), draft=str(draft), threads=2, flash_attn="auto", draft_max=7, pin_draft=True,
                n_ctx_per_slot=512, llama_server=LLAMA_SERVER)


def test_pydflash_chooses_its_draft_length_unless_the_bench_pins_it(settings):
    adaptive = servers.pydflash_command(settings | {"pin_draft": False}, 8080, 4)
    assert "--draft-max" not in adaptive
    pinned = servers.pydflash_command(settings, 8080, 4)
    assert pinned[pinned.index("--draft-max") + 1] == "7"
    native = servers.llama_server_command(settings | {"llama_server": "/bin/true", "pin_draft": False}, 8080, 4)
    assert native[native.index("--spec-draft-n-max") + 1] == "7"  # llama-server's maximum either way


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


def _sweep_row(engine, **kw):
    base = dict(
        workload="concurrency",
        engine=engine,
        concurrency=2,
        requests=4,
        output_tok_s=100.0,
        output_tok_s_min=90.0,
        output_tok_s_max=110.0,
        ttft_ms_p50=20.0,
        ttft_ms_p99=40.0,
        itl_ms_p50=5.0,
        itl_ms_p99=9.0,
        request_tok_s_p50=80.0,
        tokens_per_delivery=3.0,
        acceptance_rate=0.5,
    )
    return base | kw


def test_ratios_table_and_outputs():
    turn = dict(
        workload="multi-turn",
        turn=2,
        prompt_tokens=300,
        cache_n=280,
        prompt_n=20,
        ttft_ms=10.0,
        ttft_ms_min=9.0,
        ttft_ms_max=12.0,
    )
    rows = [
        _sweep_row("pydflash-serve", output_tok_s=120.0, itl_ms_p50=4.0),
        _sweep_row("llama-server"),
        turn | {"engine": "pydflash-serve", "ttft_ms": 8.0},
        turn | {"engine": "llama-server"},
    ]
    entries = serving_report.ratios(rows, {"llama-server": {"c2": [4, 4]}})
    assert entries[0]["output_tok_s"] == pytest.approx(1.2) and entries[0]["itl_ms_p50"] == pytest.approx(0.8)
    assert entries[0]["same_outputs"] == [4, 4] and "plain" not in entries[0]
    assert entries[0]["vs_best"] == {"engine": "llama-server", "output_tok_s": pytest.approx(1.2)}
    assert entries[1]["ttft_ms"] == pytest.approx(0.8) and entries[1]["cache_n"] == [280, 280]
    lines = serving_report.ratio_lines(entries)
    assert "output tok/s 1.200" in lines[0] and "identical outputs 4/4" in lines[0]
    assert "the better llama-server (llama-server) output tok/s 1.200 (goal met)" in lines[1]
    text = serving_report.table(rows)
    assert text.count("ratio p/l") == 2 and "1.200" in text and "0.800" in text


def test_ratio_to_the_better_llama_server_at_each_level():
    # at c=1 speculation pays (llama-server 100 > plain 80); at c=8 it does not (plain 200 > 150)
    rows = [
        _sweep_row("pydflash-serve", concurrency=1, output_tok_s=110.0),
        _sweep_row("llama-server", concurrency=1, output_tok_s=100.0),
        _sweep_row("llama-server-plain", concurrency=1, output_tok_s=80.0, acceptance_rate=None),
        _sweep_row("pydflash-serve", concurrency=8, output_tok_s=180.0, ttft_ms_p99=60.0),
        _sweep_row("llama-server", concurrency=8, output_tok_s=150.0),
        _sweep_row("llama-server-plain", concurrency=8, output_tok_s=200.0, ttft_ms_p99=30.0, acceptance_rate=None),
    ]
    same = {"llama-server": {"c1": [4, 4]}, "llama-server-plain": {"c1": [3, 4], "c8": [4, 4]}}
    c1, c8 = serving_report.ratios(rows, same)
    join_rows = [{"workload": "join", "engine": e} for e in ("pydflash-serve", "llama-server")]
    assert serving_report.ratios(rows + join_rows, same) == [c1, c8]  # the join workload has its own ratios
    assert c1["vs_best"] == {"engine": "llama-server", "output_tok_s": pytest.approx(1.1)}
    assert c8["vs_best"] == {"engine": "llama-server-plain", "output_tok_s": pytest.approx(0.9)}
    assert c8["output_tok_s"] == pytest.approx(1.2)  # against llama-server with DFlash
    assert c8["plain"]["output_tok_s"] == pytest.approx(0.9) and c8["plain"]["ttft_ms_p99"] == pytest.approx(2.0)
    assert c1["plain"]["same_outputs"] == [3, 4] and c8["same_outputs"] is None
    lines = serving_report.ratio_lines([c1, c8])
    assert "concurrency 8: pydflash / llama-server-plain output tok/s 0.900" in "\n".join(lines)
    assert lines[-1].endswith("(llama-server-plain) output tok/s 0.900 (below)")
    # the noise band: the engine of that level that differed most from itself
    c8["vs_best"]["noise"] = 0.05
    assert serving_report.ratio_lines([c8])[-1].endswith("0.900 (below, beyond the noise band of 5.0%)")
    c8["vs_best"]["noise"] = 0.12
    assert "0.900 (below 1, inside the noise band: an engine differed from itself by 12.0%)" in (
        serving_report.ratio_lines([c8])[-1]
    )
    noisy = [r | {"output_tok_s_self": x} for r, x in zip(rows, [1.02, 0.9, 1.1, 1.0, 0.95, 1.04], strict=True)]
    n1, n8 = serving_report.ratios(noisy, same)
    assert n1["vs_best"]["noise"] == pytest.approx(1 / 0.9 - 1)
    assert n8["vs_best"]["noise"] == pytest.approx(1 / 0.95 - 1)
    # without llama-server with DFlash, plain alone is the better one
    only_plain = serving_report.ratios([r for r in rows if r["engine"] != "llama-server"], {})
    assert [e["vs_best"]["engine"] for e in only_plain] == ["llama-server-plain"] * 2
    assert "output_tok_s" not in only_plain[0] and len(serving_report.ratio_lines(only_plain)) == 4
    text = serving_report.table(rows)
    assert text.count("ratio p/plain") == 2 and text.count("ratio p/l ") == 2


def _records(ttfts, gap_ms, n_tokens=4, t_sent=0.0):
    """Streams whose first token comes at ttft and then one token every gap_ms."""
    out = []
    for ttft in ttfts:
        deliveries = [Delivery(ttft + k * gap_ms / 1e3, 1, "x") for k in range(n_tokens)]
        out.append(StreamRecord(t_sent, t_sent + deliveries[-1].t_s, deliveries, {"prompt_tokens": 8}, {}, "server"))
    return out


def test_sweep_rows_aggregate_and_percentiles():
    # two repeats: 2 streams x 4 tokens over 1 s, then over 2 s: 8 and 4 tok/s, median 6
    runs = [
        {"engine": "llama-server-plain", "concurrency": 2, "repeat": 0, "wall_s": 1.0,
         "records": _records([0.1, 0.2], 10.0)},
        {"engine": "llama-server-plain", "concurrency": 2, "repeat": 1, "wall_s": 2.0,
         "records": _records([0.3, 0.4], 30.0)},
    ]  # fmt: skip
    (row,) = serving_report.sweep_rows(runs, 8, 4)
    assert row["output_tok_s"] == pytest.approx(6.0) and (row["output_tok_s_min"], row["output_tok_s_max"]) == (4, 8)
    assert row["output_tok_s_self"] == pytest.approx(2.0)  # the engine against itself: repeat 0 over repeat 1
    assert serving_report.self_ratio([10.0, 8.0, 12.0, 9.0, 11.0]) == pytest.approx(11 / 8.5)
    assert serving_report.self_ratio([10.0]) is None
    assert row["ttft_ms_p50"] == pytest.approx(250.0)
    assert row["ttft_ms_p99"] == pytest.approx(percentile([100.0, 200.0, 300.0, 400.0], 99))
    assert row["itl_ms_p50"] == pytest.approx(20.0)  # 6 gaps of 10 ms, 6 of 30 ms
    assert row["itl_ms_p99"] == pytest.approx(30.0)
    per_request = sorted(4 / (t + 3 * g) for t, g in ((0.1, 0.01), (0.2, 0.01), (0.3, 0.03), (0.4, 0.03)))
    assert row["request_tok_s_p50"] == pytest.approx((per_request[1] + per_request[2]) / 2)
    assert row["acceptance_rate"] is None and row["all_osl_tokens"] and row["tokens_per_delivery"] == 1


def test_llama_server_commands(settings, tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    s = settings | {"llama_server": str(exe)}
    spec = servers.COMMANDS["llama-server"](s, 8080, 4)
    plain = servers.COMMANDS["llama-server-plain"](s, 8080, 4)
    assert plain[:3] == [str(exe), "-m", s["target"]]
    assert not any(a.startswith(("--spec", "-md", "-ngld")) for a in plain) and s["draft"] not in plain
    assert spec[spec.index("-md") + 1] == s["draft"] and spec[spec.index("--spec-type") + 1] == "draft-dflash"

    def opts(cmd):
        return {a: cmd[i + 1] for i, a in enumerate(cmd) if a in ("-np", "-c", "-b", "-ub", "-t", "-fa", "-ngl")}

    assert (
        opts(plain)
        == opts(spec)
        == {"-np": "4", "-c": str(4 * 512), "-b": "512", "-ub": "512", "-t": "2", "-fa": "auto", "-ngl": "0"}
    )


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
    assert j.with_suffix(".png").read_bytes().startswith(b"\x89PNG")  # the chart beside the JSON


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "1"], "only with --serving"),
    (["--serving", "--csv", "x.csv"], "not with --serving"),
    (["--serving", "--isl", "16,32"], "give one value with --serving"),
    (["--serving", "--engines", "llama-server,vllm"], "serving engines"),
    (["--join", "4"], "only with --serving"),
    (["--serving", "--join", "-1"], "join streams must be >= 0"),
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
    assert {r["engine"] for r in rows} == {"pydflash-serve", "llama-server", "llama-server-plain"}
    for r in rows:
        if r["engine"] != "pydflash-serve" and r["workload"] == "concurrency":
            assert r["token_counts"] == {"server": r["requests"]} and r["all_osl_tokens"]
        if r["engine"] == "llama-server-plain":
            assert r["acceptance_rate"] is None  # no drafter: nothing drafted
    ratios = data["meta"]["ratios"]
    assert [(e["workload"], e.get("concurrency", e.get("turn"))) for e in ratios] == [
        ("concurrency", 1), ("concurrency", 2), ("multi-turn", 1), ("multi-turn", 2)]
    for e in ratios[:2]:
        assert e["vs_best"]["engine"] in ("llama-server", "llama-server-plain") and e["plain"]["output_tok_s"] > 0
    assert j.with_suffix(".png").stat().st_size > 0
    llama_turn2 = next(r for r in rows if r["engine"] == "llama-server" and r.get("turn") == 2)
    assert llama_turn2["cache_n"] > 0


def test_steady_throughput_counts_only_while_every_stream_runs():
    # 2 streams x 2 requests. Stream A: requests at 0 s and 1 s, 10 tokens each over 0.9 s
    # (first token at 0.1 s); stream B: 0 s (first token at 0.2 s) and 2 s, a slow tail.
    def rec(t_sent, ttft, n, gap):
        d = [Delivery(ttft + k * gap, 1, "x") for k in range(n)]
        return StreamRecord(t_sent, t_sent + d[-1].t_s, d, {}, {}, "server")

    a1, a2 = rec(0.0, 0.1, 10, 0.1), rec(1.0, 0.1, 10, 0.1)
    b1, b2 = rec(0.0, 0.2, 10, 0.2), rec(2.0, 0.2, 10, 0.2)
    # the window: from the last first token of round one (0.2 s) to the first end of the last
    # round (a2 at 2.0 s); tokens inside it: a1 at 0.3..1.0 (8), a2 at 1.1..2.0 (10), b1 at 0.4..2.0 (9)
    got = serving_report.steady_tok_s([a1, b1, a2, b2], 2)
    assert got == pytest.approx((8 + 10 + 9) / 1.8)
    assert serving_report.steady_tok_s([a1, b1], 2) == pytest.approx((8 + 4) / (1.0 - 0.2))  # one round: a1 ends it
    assert serving_report.steady_tok_s([rec(0.0, 0.5, 1, 0.1), rec(0.0, 0.1, 1, 0.1)], 2) is None  # ends before it fills
