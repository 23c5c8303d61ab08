"""`pydflash bench --serving --join` (a long prompt joins running streams) and the
sweep's chart: the join window's selection and figures on synthetic records,
then a tiny real run of `pydflash serve` (the embedded pair) through the CLI.
The figures of a real run are not checked (benchmarks report, tests do not time)."""

from __future__ import annotations

import json

import pytest

from pydflash.bench import join, serving_chart
from pydflash.bench.sse_client import Delivery, StreamRecord
from pydflash.cli import main as cli


def record(t_sent: float, arrivals: list[tuple[float, int]], prompt_tokens: int = 8) -> StreamRecord:
    """A stream sent at t_sent whose deliveries (absolute time, tokens) arrive as given."""
    deliveries = [Delivery(t - t_sent, n, "x" * n) for t, n in arrivals]
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": sum(n for _, n in arrivals)}
    return StreamRecord(t_sent, arrivals[-1][0], deliveries, usage, {}, "steps")


def rounded(pairs: list[tuple[float, int]]) -> list[tuple[float, int]]:
    return [(round(g, 9), n) for g, n in pairs]


def test_gaps_select_the_window():
    # deliveries at 1.0, 1.1, 1.2, then a 0.5 s stall (1.2 -> 1.7, 3 tokens), then 1.8
    rec = record(0.0, [(1.0, 1), (1.1, 2), (1.2, 1), (1.7, 3), (1.8, 1)])
    assert rounded(join.gaps(rec)) == [(0.1, 2), (0.1, 1), (0.5, 3), (0.1, 1)]
    # a window inside the stall: only the stall overlaps it
    assert rounded(join.gaps(rec, 1.3, 1.5)) == [(0.5, 3)]
    # a gap that ends right at the window's start, or starts at its end, is outside
    assert rounded(join.gaps(rec, 1.2, 1.7)) == [(0.5, 3)]
    assert rounded(join.gaps(rec, 1.15, 1.25)) == [(0.1, 1), (0.5, 3)]
    assert join.gaps(rec, 2.0, 3.0) == []


def test_join_rows_window_and_overall():
    # the joiner is sent at 1.25 and has its first token 0.35 s later: window [1.25, 1.60 + 0.02]
    joiner = record(1.25, [(1.6, 1), (1.7, 1)], prompt_tokens=2000)
    a = record(0.0, [(1.0, 1), (1.1, 2), (1.2, 1), (1.7, 3), (1.8, 1)])
    b = record(0.0, [(1.05, 1), (1.15, 1), (1.25, 1), (1.35, 1), (1.45, 1), (1.55, 1), (1.65, 1), (1.75, 1)])
    run = {"engine": "pydflash-serve", "repeat": 0, "streams": [a, b], "joiner": joiner}
    assert join.window(run, 0.02) == pytest.approx((1.25, 1.62))
    (row,) = join.join_rows([run], 0.02)
    # in the window: a's stall (0.5 s, 3 tokens) and b's gaps ending at 1.35 ... 1.65 (4 x 0.1 s, 1 token)
    assert row["window_gaps"] == 5
    assert row["window_gap_ms_max"] == pytest.approx(500.0) and row["window_itl_ms_max"] == pytest.approx(500 / 3)
    assert row["window_gap_ms_p50"] == pytest.approx(100.0)
    # ITL counts a delivery's tokens: 3 values of 166.7 ms and 4 of 100 ms
    assert row["window_itl_ms_p50"] == pytest.approx(100.0)
    assert row["window_itl_ms_p99"] == pytest.approx(500 / 3)
    assert row["gaps"] == 4 + 7 and row["gap_ms_max"] == pytest.approx(500.0)
    assert row["joiner_ttft_ms"] == pytest.approx(350.0) and row["window_ms"] == pytest.approx(370.0)
    assert row["join_prompt_tokens"] == 2000 and row["streams"] == 2 and row["streams_outlasted_window"]
    # a stream that ended inside the window is flagged
    short = dict(run, streams=[a, record(0.0, [(1.0, 1), (1.3, 1)])])
    assert not join.join_rows([short], 0.02)[0]["streams_outlasted_window"]


def test_join_ratios_and_text():
    def row(engine, p99, gap_max, ttft):
        return {"workload": "join", "engine": engine, "window_itl_ms_p99": p99, "window_gap_ms_p99": p99,
                "window_gap_ms_max": gap_max, "joiner_ttft_ms": ttft, "window_ms": ttft + 200, "window_itl_ms_p50": 5.0,
                "itl_ms_p50": 5.0, "itl_ms_p99": 9.0, "gap_ms_p99": 9.0, "gap_ms_max": gap_max,
                "streams_outlasted_window": engine != "llama-server"}  # fmt: skip

    rows = [row("pydflash-serve", 40.0, 80.0, 300.0), row("llama-server", 50.0, 100.0, 200.0),
            row("llama-server-plain", 20.0, 40.0, 150.0)]  # fmt: skip
    (entry,) = join.join_ratios(rows)
    assert entry["vs"]["llama-server"]["window_itl_ms_p99"] == pytest.approx(0.8)
    assert entry["vs"]["llama-server-plain"]["window_gap_ms_max"] == pytest.approx(2.0)
    assert entry["vs"]["llama-server"]["joiner_ttft_ms"] == pytest.approx(1.5)
    assert join.join_ratios(rows[1:]) == [] and join.join_ratios(rows[:1]) == []
    lines = join.join_lines([entry])
    assert len(lines) == 2 and "pydflash / llama-server-plain: running streams' ITL p99 2.000" in lines[1]
    text = join.join_table(rows)
    assert text.count("\n") == 3 and text.count("raise --join-osl") == 1


def test_chart_one_panel_per_result(tmp_path):
    def rows(scale):
        return [{"workload": "concurrency", "engine": e, "concurrency": c, "output_tok_s": scale * c * k}
                for k, e in enumerate(("llama-server-plain", "pydflash-serve", "llama-server"), 1)
                for c in (1, 2, 4)] + [{"workload": "multi-turn", "engine": "llama-server", "turn": 1}]  # fmt: skip

    lines = serving_chart.series(rows(1.0))
    assert list(lines) == ["pydflash-serve", "llama-server", "llama-server-plain"]
    assert lines["llama-server-plain"] == [(1, 1.0), (2, 2.0), (4, 4.0)]
    for i, scale in enumerate((1.0, 2.0)):
        (tmp_path / f"r{i}.json").write_text(json.dumps({"meta": {"models": {"target": f"pair {i}"}},
                                                         "rows": rows(scale)}))  # fmt: skip
    out = tmp_path / "both.png"
    assert serving_chart.main([str(tmp_path / "r0.json"), str(tmp_path / "r1.json"), "-o", str(out)]) == 0
    import matplotlib.image

    one = tmp_path / "one.png"
    serving_chart.write_chart(one, [("pair 0", rows(1.0))])
    # two panels side by side: twice as wide as one, as high
    two_h, two_w = matplotlib.image.imread(out).shape[:2]
    one_h, one_w = matplotlib.image.imread(one).shape[:2]
    assert two_h == one_h and two_w == pytest.approx(2 * one_w, rel=0.01)
    with pytest.raises(ValueError, match="no concurrency sweep"):
        serving_chart.write_chart(tmp_path / "x.png", [("turns only", rows(1.0)[-1:])])


TINY = ["--pad-ffn", "0", "--repeats", "1", "--warmup", "0", "--isl", "24", "--threads", "2"]


def test_cli_join_runs_pydflash(tmp_path, capsys):
    j = tmp_path / "join.json"
    rc = cli(["bench", "--serving", "--engines", "pydflash-serve", "--concurrency", "", "--turns", "0", "--join", "2",
              "--join-prompt", "300", "--join-osl", "1500", *TINY, "--json", str(j)])  # fmt: skip
    assert rc == 0
    out = capsys.readouterr().out
    assert "joiner ttft" in out and "in window" in out
    data = json.loads(j.read_text())
    (row,) = data["rows"]
    assert row["workload"] == "join" and row["engine"] == "pydflash-serve" and row["streams"] == 2
    assert row["join_prompt_tokens"] == 300 and row["joiner_ttft_ms"] > 0
    assert row["gaps"] > 0 and row["itl_ms_p50"] > 0 and row["gap_ms_max"] >= row["gap_ms_p99"]
    # the joiner was sent while both streams decoded, and they outlasted its prefill
    assert row["streams_outlasted_window"] and row["window_gaps"] > 0
    assert row["window_ms"] == pytest.approx(row["joiner_ttft_ms"] + 200.0)
    assert data["meta"]["command_config"]["join_streams"] == 2 and data["meta"]["ratios"] == []
    assert not j.with_suffix(".png").exists()  # no sweep: nothing to chart
