"""`pydflash bench` end to end on the embedded pair, kept tiny: the numbers are
not checked here (benchmarks report, tests do not time), the machinery is:
rows, ratios, the in-bench losslessness check, prompts of exactly ISL tokens,
the output files, and the parser of llama.cpp's native output."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from pydflash import Llama, embedded_pair
from pydflash.bench import BenchConfig, report, run
from pydflash.bench.engines import parse_native_output
from pydflash.bench.workload import WORKLOADS, make_prompts, text_codec
from pydflash.cli import main as cli

REQUIRED = {"engine", "isl", "osl", "draft_max", "decode_tok_s", "prefill_tok_s", "tau", "acceptance_rate",
            "speedup", "ttft_ms", "itl_ms", "rss_peak_mib"}


@pytest.fixture(scope="module")
def result():
    cfg = BenchConfig(isl=(24, 40), repeats=2, warmup=0, draft_max=(1, 3), pad_ffn=0, bandwidth=False,
                      engines=(report.TARGET_ONLY, report.DFLASH, report.ADAPTIVE), threads=2)
    return run(cfg, log=lambda _: None)


def test_rows_cover_both_sweeps(result):
    rows = result["rows"]
    assert all(REQUIRED <= set(r) for r in rows)
    keys = {(r["engine"], r["isl"], r["draft_max"]) for r in rows}
    assert keys == {(report.TARGET_ONLY, 24, 0), (report.TARGET_ONLY, 40, 0),
                    (report.DFLASH, 24, 7), (report.DFLASH, 40, 7),     # context sweep at block_size - 1
                    (report.DFLASH, 24, 1), (report.DFLASH, 24, 3),     # draft_max sweep at the smallest ISL
                    (report.ADAPTIVE, 24, None), (report.ADAPTIVE, 40, None)}  # once per ISL: it chooses
    for r in rows:
        assert r["repeats"] == 2 and r["isl_measured"] == r["isl"]
        assert r["decode_tok_s_min"] <= r["decode_tok_s"] <= r["decode_tok_s_max"]
        if r["engine"] == report.TARGET_ONLY:
            assert r["speedup"] == 1.0 and r["tau"] == 1.0 and r["acceptance_rate"] is None
        else:
            assert 1.0 <= r["tau"] <= (r["draft_max"] if r["draft_max"] is not None else 7) + 1
            assert 0.0 <= r["mean_draft_len"] <= (r["draft_max"] if r["draft_max"] is not None else 7)
            if r["engine"] == report.ADAPTIVE and r["acceptance_rate"] is None:
                # the embedded pair as is is compute-bound here: the policy may rightly draft
                # nothing (the lengths it asked for, if any, the confidence cut emptied): one
                # token per step
                assert r["tau"] == 1.0
            else:
                assert 0.0 <= r["acceptance_rate"] <= 1.0
            assert r["same_tokens_as_target"] is True
            assert r["memory"]["drafter_bytes"] > 0
    assert result["meta"]["skipped"] == {}
    assert any("speed-up over target-only" in g for g in result["goals"])


def test_adaptive_ratios(result):
    rows = result["rows"]
    tok_s = {(r["engine"], r["isl"], r["draft_max"]): r["decode_tok_s"] for r in rows}
    ratios = {r["isl"]: r for r in result["meta"]["adaptive_ratios"]}
    assert set(ratios) == {24, 40}
    r = ratios[24]  # the draft_max sweep ran here: 1, 3 and 7
    assert r["fixed_draft_max_measured"] == [1, 3, 7] and r["default_draft_max"] == 7
    best = max((1, 3, 7), key=lambda d: tok_s[(report.DFLASH, 24, d)])
    assert r["best_fixed_draft_max"] == best
    a = tok_s[(report.ADAPTIVE, 24, None)]
    assert r["over_best_fixed"] == pytest.approx(a / tok_s[(report.DFLASH, 24, best)])
    assert r["over_default_fixed"] == pytest.approx(a / tok_s[(report.DFLASH, 24, 7)])
    assert r["over_target_alone"] == pytest.approx(a / tok_s[(report.TARGET_ONLY, 24, 0)])
    # run by run: every engine decoded prompt r in run r; the paired ratio is the median of those
    runs = {(x["engine"], x["isl"], x["draft_max"]): dict(zip(x["repeats_run"], x["decode_tok_s_runs"])) for x in rows}
    ad, tg = runs[(report.ADAPTIVE, 24, None)], runs[(report.TARGET_ONLY, 24, 0)]
    assert set(ad) == set(tg) == set(range(rows[0]["repeats"]))
    assert r["paired_over_target_alone"] == pytest.approx(statistics.median(ad[k] / tg[k] for k in ad))
    per = {d: statistics.median(ad[k] / runs[(report.DFLASH, 24, d)][k] for k in ad) for d in (1, 3, 7)}
    assert r["paired_over_fixed"] == pytest.approx({str(d): v for d, v in per.items()})
    assert r["paired_over_best_fixed"] == pytest.approx(min(per.values()))
    assert r["paired_over_default_fixed"] == pytest.approx(per[7])
    # by total decode time: each run decodes OSL tokens, so the times are inverse rates
    tot = {d: sum(1 / runs[(report.DFLASH, 24, d)][k] for k in ad) / sum(1 / ad[k] for k in ad) for d in (1, 3, 7)}
    assert r["total_over_fixed"] == pytest.approx({str(d): v for d, v in tot.items()})
    assert r["total_over_best_fixed"] == pytest.approx(min(tot.values()))
    assert r["total_best_fixed_draft_max"] == min(tot, key=tot.__getitem__)
    assert r["total_over_default_fixed"] == pytest.approx(tot[7])
    assert r["total_over_target_alone"] == pytest.approx(sum(1 / tg[k] for k in ad) / sum(1 / ad[k] for k in ad))
    assert ratios[40]["fixed_draft_max_measured"] == [7]  # only the context sweep's draft_max there
    assert sum("adaptive / best fixed draft_max" in g for g in result["goals"]) == 2
    assert sum(g.startswith("by total decode time") for g in result["goals"]) == 2
    assert "~" in report.table(rows)  # the adaptive row's draft_max column: its mean length


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_prompts_have_exactly_isl_tokens(workload):
    t, _ = embedded_pair()
    corpus = WORKLOADS[workload]()
    with Llama(t, n_ctx=64) as tok:
        for isl in (2, 17, 300):
            tokenize, detokenize = text_codec(tok)
            prompts = make_prompts(tokenize, detokenize, isl, 3, corpus)
            assert len(set(prompts)) == 3
            assert [len(tokenize(p)) for p in prompts] == [isl] * 3


def test_cli_writes_json_csv(tmp_path, capsys):
    j, c = tmp_path / "b.json", tmp_path / "b.csv"
    rc = cli(["bench", "--isl", "16", "--repeats", "1", "--warmup", "0", "--draft-max", "2", "--pad-ffn", "0",
              "--engines", "pydflash-target,pydflash-dflash", "--no-bandwidth", "--json", str(j), "--csv", str(c)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "pydflash-dflash" in out and "speed-up" in out
    data = json.loads(j.read_text())
    assert {r["engine"] for r in data["rows"]} == {"pydflash-target", "pydflash-dflash"}
    assert data["meta"]["goals"]
    with c.open() as f:
        assert len(list(csv.DictReader(f))) == len(data["rows"])


def test_draft_window_reaches_the_pydflash_engines(tmp_path, capsys):
    j = tmp_path / "b.json"
    rc = cli(["bench", "--isl", "16", "--repeats", "1", "--warmup", "0", "--draft-max", "2", "--pad-ffn", "0",
              "--engines", "pydflash-target,pydflash-dflash", "--no-bandwidth", "--draft-window", "16",
              "--json", str(j)])
    assert rc == 0, capsys.readouterr().err
    meta = json.loads(j.read_text())["meta"]
    assert meta["command_config"]["draft_window"] == 16
    assert meta["engines"]["pydflash-dflash"]["draft_window"] == 16  # what the pair applied
    for extra in (["--serving"], ["--workloads", "code"]):
        assert cli(["bench", "--draft-window", "16", *extra]) == 2
        assert "--draft-window" in capsys.readouterr().err
    with pytest.raises(ValueError, match="draft_window must be >= 0"):
        BenchConfig(draft_window=-1).validate()


def test_a_context_sweep_at_draft_max_0_is_the_pair_decoding_plainly(tmp_path, capsys):
    # --ctx-draft-max 0 measures the pair pinned to plain steps beside the target alone
    # (it was read as "not given": block size - 1)
    j = tmp_path / "b.json"
    rc = cli(["bench", "--isl", "16", "--repeats", "1", "--warmup", "0", "--ctx-draft-max", "0", "--draft-max", "0",
              "--pad-ffn", "0", "--engines", "pydflash-target,pydflash-dflash", "--no-bandwidth", "--json", str(j)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(j.read_text())
    assert data["meta"]["ctx_draft_max"] == 0 and data["meta"]["draft_max_sweep"] == [0]
    pair = [r for r in data["rows"] if r["engine"] == "pydflash-dflash"]
    assert [(r["draft_max"], r["mean_draft_len"], r["tau"]) for r in pair] == [(0, 0.0, 1.0)]
    with pytest.raises(ValueError, match="ctx_draft_max must be >= 0"):
        BenchConfig(ctx_draft_max=-1).validate()


def test_target_only_engines(tmp_path, capsys):
    # no engine drafts: there is no draft_max sweep to run (was a ZeroDivisionError)
    j = tmp_path / "b.json"
    rc = cli(["bench", "--isl", "16", "--repeats", "2", "--warmup", "0", "--pad-ffn", "0",
              "--engines", "pydflash-target", "--no-bandwidth", "--json", str(j), "--flash-attn", "off"])
    assert rc == 0
    data = json.loads(j.read_text())
    assert [(r["engine"], r["isl"], r["repeats"]) for r in data["rows"]] == [("pydflash-target", 16, 2)]
    assert data["meta"]["command_config"]["flash_attn"] == "off"
    assert "pydflash-target" in capsys.readouterr().out


def test_bad_bench_arguments(capsys):
    assert cli(["bench", "--engines", "nonsense"]) == 2
    assert "unknown engines" in capsys.readouterr().err
    with pytest.raises(ValueError, match="workload must be one of"):
        BenchConfig(workload="poetry").validate()
    with pytest.raises(ValueError, match="flash_attn must be auto, on or off"):
        BenchConfig(flash_attn="yes").validate()
    assert cli(["bench", "-d", "only-drafter.gguf"]) == 2  # a drafter needs its target
    assert "needs its target" in capsys.readouterr().err


def test_a_target_without_a_drafter_is_measured_alone_and_with_ngram_drafts(tmp_path, capsys):
    target, _ = embedded_pair()
    j = tmp_path / "b.json"
    rc = cli(["bench", "-m", target, "--isl", "16", "--repeats", "1", "--warmup", "0", "--pad-ffn", "0",
              "--engines", "pydflash-target,pydflash-dflash", "--threads", "1", "--no-bandwidth", "--json", str(j)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(j.read_text())
    assert [(r["engine"], r["isl"]) for r in data["rows"]] == [("pydflash-target", 16)]
    assert "no drafter" in data["meta"]["skipped"]["pydflash-dflash"]
    j = tmp_path / "w.json"
    rc = cli(["bench", "-m", target, "--workloads", "code", "--stack", "ngram-mod,draft-dflash", "--isl", "16",
              "--osl", "8", "--prompts", "1", "--repeats", "1", "--pad-ffn", "0", "--threads", "1", "--json", str(j)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(j.read_text())
    engines = {r["engine"] for r in data["rows"]}
    # the stack less its drafter (and llama.cpp's loop with the same list where it is built)
    assert {e for e in engines if not e.startswith("llama.cpp ")} == {"pydflash target", "pydflash ngram-mod"}
    assert engines - {"pydflash target", "pydflash ngram-mod"} <= {"llama.cpp ngram-mod"}
    assert "no drafter" in data["meta"]["skipped"]["pydflash draft-dflash"]


def test_native_output_parser():
    # the lines llama-speculative-simple prints at the end (examples/speculative-simple)
    text = ("encoded   64 tokens in    0.210 seconds, speed:  304.762 t/s\n"
            "decoded   66 tokens in    1.500 seconds, speed:   44.000 t/s\n\n"
            "n_draft   = 7\nn_predict = 66\nn_drafted = 140\nn_accept  = 46\naccept    = 32.857%\n")
    m = parse_native_output(text)
    assert (m["isl"], m["n_generated"], m["n_drafted"], m["n_accepted"], m["n_steps"]) == (64, 66, 140, 46, 20)
    assert m["decode_s"] == pytest.approx(1.5) and m["prefill_s"] == pytest.approx(0.21)
    with pytest.raises(RuntimeError, match="could not read"):
        parse_native_output("decoded 3 tokens")


def test_adaptive_ratios_beside_the_target_alone_only():
    # the embedded pair's runs measure the adaptive engine beside the target alone only:
    # the paired and total-time lines still print, against the target alone
    def row(engine: str, dm: int | None, runs: list[float]) -> dict:
        return dict(engine=engine, isl=128, osl=128, draft_max=dm, decode_tok_s=statistics.median(runs),
                    repeats_run=list(range(len(runs))), decode_tok_s_runs=runs)

    rows = [row(report.TARGET_ONLY, 0, [100.0, 200.0, 100.0]), row(report.ADAPTIVE, None, [110.0, 100.0, 100.0])]
    (r,) = report.adaptive_ratios(rows)
    assert r["paired_over_target_alone"] == pytest.approx(1.0)  # the median of 1.1, 0.5, 1.0
    total = (1 / 100 + 1 / 200 + 1 / 100) / (1 / 110 + 1 / 100 + 1 / 100)
    assert r["total_over_target_alone"] == pytest.approx(total)
    assert r["total_over_best_fixed"] is None and r["total_over_fixed"] == {}
    lines = report.goals(rows)
    assert "paired by prompt (median of run-by-run ratios), isl 128 osl 128: adaptive / target alone 1.000" in lines
    assert f"by total decode time, isl 128 osl 128: adaptive / target alone {total:.3f}" in lines
