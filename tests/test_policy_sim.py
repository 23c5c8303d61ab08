"""tools/policy_sim.py: its premise (a recorded trace predicts what the engine's drafts
keep), its replay of fixed lengths, and the adaptive policy end to end on machines
whose answer is known: drafting that cannot pay stays off, drafting that pays is
taken at the length that pays most."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pydflash import Llama
from pydflash.embedded import embedded_pair

TOOL = Path(__file__).resolve().parent.parent / "tools" / "policy_sim.py"
spec = importlib.util.spec_from_file_location("policy_sim", TOOL)
assert spec is not None and spec.loader is not None
sim = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sim)


def machine(verify: list[float], draft: float) -> dict:
    """Only the passes cost: no overheads, no switch, no Python."""
    zero = dict.fromkeys(("other_d", "other_p", "inject_row", "switch_first", "switch_each"), 0.0)
    return dict(verify=verify, draft=draft, py_single=0.0, py_run=0.0, py_choose=0.0, **zero)


def test_a_trace_predicts_what_the_engines_drafts_keep():
    target, draft = embedded_pair()
    traces = sim.record_traces("prose", 2, target, draft, positions=48)
    assert len(traces) == 2 and all(len(a) == 48 for a in traces)
    from pydflash.bench.tasks import prompts

    with Llama(target, draft=draft, n_ctx=1024, n_batch=512) as pair:
        ps = prompts("prose", pair.tokenize, pair.detokenize, 128, 2)
        checked = 0
        for p, a in zip(ps, traces, strict=True):
            r = pair.generate(pair.tokenize(p), max_tokens=40, ignore_eos=True, draft_max=3, cache_prompt=False)
            pos = 0
            for s in r.stats.steps:
                if s.n_drafted:
                    assert s.n_accepted == min(s.n_drafted, a[pos]), (pos, s.n_drafted, s.n_accepted, a[pos])
                    checked += 1
                pos += len(s.tokens)
    assert checked > 10


def test_fixed_lengths_replay_the_trace():
    m = machine([0, 1, 2, 3, 4, 5, 6, 7, 8], 1.0)
    # a draft of 3 keeps 2 everywhere: 42 steps of 3 tokens (5 ms: 4 rows and the drafter),
    # then at 126 the budget allows a draft of 1 (3 ms), which keeps it: 128
    assert sim.run_fixed([[2] * 128], sim.Machine(m, 0.0, 0, None), 3) == pytest.approx(42 * 5 + 3)
    assert sim.run_fixed([[2] * 128], sim.Machine(m, 0.0, 0, None), 0) == pytest.approx(128 * 1)
    each: list[float] = []  # per generation, as the bench pairs runs by prompt
    total = sim.run_fixed([[2] * 128, [0] * 128], sim.Machine(m, 0.0, 0, None), 3, each)
    # nothing kept: a step per token, the draft cut short by the budget over the last three
    assert each == pytest.approx([42 * 5 + 3, 125 * 5 + 4 + 3 + 1]) and sum(each) == pytest.approx(total)


def test_drafting_that_cannot_pay_stays_off():
    # a drafting step costs 10 plain steps and yields at most 2 tokens
    m = machine([0, 1, 9, 9, 9, 9, 9, 9, 9], 1.0)
    paired: dict[str, float] = {}
    res = sim.evaluate([[1] * 128] * 20, m, seeds=2, sigma=0.05, paired=paired)
    assert max(res[f"f{k}"] for k in range(1, 8)) < 0.25
    assert min(paired[f"f{k}"] for k in range(1, 8)) > 4 and 0.95 < paired["f0"] <= 1.01, paired
    # (<= 1, but the adaptive run draws its own per-step noise: its mean moves the ratio by
    # ~0.1-0.2% either way, and with probes every 4,096 steps little else is left)
    assert 0.95 < res["adaptive"] <= 1.005, res


def test_drafting_that_pays_is_taken_at_its_best_length():
    # every draft is kept whole, and a pass of 8 rows costs about what 1 costs
    m = machine([0, 1, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35], 0.2)
    res = sim.evaluate([[7] * 128] * 20, m, seeds=2, sigma=0.05)
    best = max(range(1, 8), key=lambda k: res[f"f{k}"])
    assert best == 7 and res["f7"] > 4
    assert res["adaptive"] > 0.95 * res["f7"], res


def test_the_cli_runs_a_trace_file(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps([[1, 2, 0, 3] * 32] * 4))
    out = subprocess.run(
        [
            sys.executable,
            str(TOOL),
            "run",
            str(f),
            "--seeds",
            "1",
            "--burst",
            "50,20,2",
            "--set",
            "PROBE_BUDGET=0.02",
            "--miscalibrate",
            "0.5,0.8",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "adaptive / best fixed" in out and "f7" in out
    assert "paired by prompt (median of ratios), adaptive / f0" in out
    bad = subprocess.run([sys.executable, str(TOOL), "run", str(f), "--set", "NOPE=1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "_draft_policy has no NOPE" in bad.stderr


@pytest.mark.parametrize("missed", [3, 6, 11])
def test_a_new_pairs_first_generation_drafts_after_its_first_positions_missed(missed):
    # the shipped pair on the demo's prompts: nothing kept for the first 3-11 steps, then
    # most blocks whole. A new pair's estimate then came from those steps alone and its
    # probes were budgeted tens of steps apart: 1.63x the target alone here where a fixed
    # draft of 7 gave 2.15-2.95x. It probes on the doubling wait until PROBE_NEWS
    trace = [[0] * missed + [sim.BLOCK - 1] * (sim.OSL - missed)]

    def times(m: dict) -> tuple[float, float, float]:  # the target alone, fixed 7, adaptive
        return (sim.run_fixed(trace, sim.Machine(m, 0.0, 0, None), 0),
                sim.run_fixed(trace, sim.Machine(m, 0.0, 0, None), sim.BLOCK - 1),
                sim.run_adaptive(trace, sim.Machine(m, 0.0, 0, None, noise=1)))

    alone, fixed, adaptive = times(sim.MACHINES["padded"])
    assert fixed / adaptive >= 0.95, (alone / adaptive, alone / fixed)
    alone, _, adaptive = times(sim.MACHINES["embedded"])
    assert alone / adaptive >= 0.98  # compute-bound: drafting cannot pay, and probes stay within budget


def test_a_miscalibration_scales_the_drafting_passes_only():
    m = machine([0, 1, 2, 3, 4, 5, 6, 7, 8], 1.0)
    cm = sim.calibrated(m, (0.5, 2.0))
    assert cm.verify_ms(1) == pytest.approx(1.0)  # a plain step's pass: as measured
    assert cm.verify_ms(4) == pytest.approx(8.0)
    assert cm.draft_ms(8) == pytest.approx(0.5)


def test_a_replay_repeats_exactly():
    # the policy's own timing of its weighings reads the table's clock, not this machine's
    traces = [[(i * 7 + j) % 5 for i in range(128)] for j in range(6)]
    runs = [sim.evaluate(traces, sim.MACHINES["embedded"], seeds=2, burst=(100.0, 40.0, 2.0)) for _ in range(2)]
    assert runs[0] == runs[1]
    assert 0.5 < runs[0]["adaptive"] < 1.5


def test_a_rule_of_one_length_replays_as_that_fixed_length():
    traces = [[(i * 7 + j) % 5 for i in range(128)] for j in range(4)]
    for k in range(1, 8):
        rule = dict.fromkeys(sim.OUTCOMES, k)
        each: list[float] = []
        want: list[float] = []
        sim.run_rule(traces, sim.Machine(sim.MACHINES["padded"], 0.0, 0, None), rule, each)
        sim.run_fixed(traces, sim.Machine(sim.MACHINES["padded"], 0.0, 0, None), k, want)
        assert each == pytest.approx(want)


def test_a_rule_drafts_by_the_last_steps_outcome():
    m = machine([0, 1, 2, 3, 4, 5, 6, 7, 8], 1.0)
    # nothing kept: a draft of 1 (3 ms) misses, so a plain step (1 ms) follows, then a draft
    # of 1 again: 64 of each for 128 tokens
    rule = dict(start=1, plain=1, miss=0, part=1, whole=1)
    assert sim.run_rule([[0] * 128], sim.Machine(m, 0.0, 0, None), rule) == pytest.approx(64 * 3 + 64 * 1)
    # everything kept: a draft of 2 (4 ms, 3 tokens), then 7s (9 ms, 8 tokens) while the budget allows:
    # 3 + 15 * 8 = 123 tokens, then the budget cuts the draft to 4 (6 ms): 128
    rule = dict(start=2, plain=0, miss=0, part=1, whole=7)
    assert sim.run_rule([[7] * 128], sim.Machine(m, 0.0, 0, None), rule) == pytest.approx(4 + 15 * 9 + 6)


def test_the_three_measures_of_a_rule():
    # per-prompt times 1 and 2 ms against a fixed length's 2 and 2
    total, paired, medians = sim.measures([1.0, 2.0], {3: [2.0, 2.0]})
    assert total == pytest.approx(4 / 3) and paired == pytest.approx(1.5) and medians == pytest.approx(2 / 1.5)
    # the worst over the fixed lengths, each measure apart
    total, paired, medians = sim.measures([1.0, 2.0], {3: [2.0, 2.0], 4: [1.0, 4.0]})
    assert total == pytest.approx(4 / 3) and paired == pytest.approx(1.5) and medians == pytest.approx(2 / 1.5)
    assert sim.measures([1.0, 2.0], {5: [0.5, 1.0]}) == pytest.approx((0.5, 0.5, 0.5))


def test_rules_find_the_longest_draft_where_everything_is_kept(tmp_path):
    # a memory-bound machine (a pass costs the same for any rows) and a drafter that is always right
    m = machine([0] + [1.0] * 8, 0.1)
    found = sim.rule_search([[7] * 128] * 3, m)
    rule, (total, paired, medians) = found["total"]
    # a whole draft kept is followed by the longest; its first step drafts 1 or 2, fixed 7 drafts 7
    # from the start: 17 passes against 16
    assert rule["whole"] == 7
    assert total == paired == medians == pytest.approx(16 / 17)
    assert "goal" not in found  # none reaches 0.98 of fixed 7 by every measure
    f = tmp_path / "t.json"
    f.write_text(json.dumps([[1, 2, 0, 3] * 32] * 4))
    out = subprocess.run(
        [sys.executable, str(TOOL), "rules", str(f), "--machine", "embedded"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert [line.split()[1] for line in out.splitlines()[1:]] == ["total", "goal", "adaptive"]
