#!/usr/bin/env python3
"""The adaptive draft length (the package's own DraftPolicy) replayed on recorded
acceptance, against every fixed draft_max, with step times from a table instead of
this machine's clock: a policy change is weighed without the timing noise that a
real A/B of a few percent drowns in here.

    python benchmarks/policy_sim.py traces --workload prose [--prompts 40] --out prose.json
    python benchmarks/policy_sim.py costs --target T.gguf --draft D.gguf --out costs.json
    python benchmarks/policy_sim.py run prose.json [--machine padded|embedded|costs.json]
        [--seeds 5] [--burst NORMAL,SLOW,FACTOR] [--miscalibrate DRAFT,VERIFY] [--set NAME=VALUE ...]

A trace holds, per prompt, the tokens a full draft keeps at each position of the
target's greedy output (the embedded pair's, 128 positions): the drafter's proposal
at a position depends only on the prefix, which greedy decoding fixes, so a draft of
k there keeps min(k, a[i]) (tests/test_policy_sim.py checks that against the engine).
``run`` drives DraftPolicy (``choose``, ``observe``) as the engine drives one generation
whose reader waits for the end (plain steps in runs, weighings, probes), each step's
time the machine table's for its rows times noise: lognormal per step and, with
``--burst``, slow intervals in time (mean lengths in plain steps, and the slowdown)
that every engine of a seed meets at the same times, as a busy neighbour would;
``--miscalibrate`` starts the policy from a calibration that misjudged drafting steps.
It prints each engine's speed over the target alone (by total time) and the adaptive
one's over each, paired by prompt as the bench pairs runs, the means over seeds; a
replay repeats exactly.

What it leaves out: llama.cpp's graph rebuilds beyond a fixed switch cost,
drafts that differ from the trace's near the end of a generation's budget, and
the engine's confidence cut (``CONFIDENCE_CUT``: a trace holds no drafter
probabilities, so the policy replays without a cut, every draft verified whole)."""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

from pydflash.draft_length import policy as dp
from pydflash.draft_length.cost import CostModel
from pydflash.draft_length.policy import DraftPolicy, Outcome

OSL = 128
BLOCK = 8  # the embedded drafter's block: its pass covers every row of it
# step times in ms on this 2-core machine (2026-12-04). Measured as ``costs`` measures
# them (medians of 20 steps per draft_max): verify[r], the target pass over r rows, and
# draft, the drafter pass. Estimated from in-process timings, not measured one by one:
# other_d / other_p, the rest of a drafting / plain step (a drafting step's injection
# took 0.39 ms padded, 0.15 embedded); inject_row, per row a drafting step injects after
# steps off; switch_*, the excess of the plain steps after a drafting step (the first,
# the next 15: 16 steps after a probe averaged 13-40 us more each on the embedded pair);
# py_*, the engine's Python per single step, per step of a run (505 against 487 us per
# embedded plain step), per weighing
MACHINES: dict[str, dict[str, float | list[float]]] = {
    "padded": dict(
        verify=[0, 12.26, 18.10, 19.25, 20.62, 21.55, 22.68, 23.89, 25.97],
        draft=1.95,
        other_d=0.5,
        other_p=0.1,
        inject_row=0.01,
        switch_first=0.0,
        switch_each=0.0,
        py_single=0.03,
        py_run=0.01,
        py_choose=0.04,
    ),
    "embedded": dict(
        verify=[0, 0.48, 0.79, 0.95, 1.12, 1.29, 1.28, 1.60, 1.71],
        draft=1.0,
        other_d=0.27,
        other_p=0.02,
        inject_row=0.005,
        switch_first=0.3,
        switch_each=0.03,
        py_single=0.04,
        py_run=0.01,
        py_choose=0.04,
    ),
}
RUN_MS = 20.0  # the engine's RUN_MS
SWITCH = 16  # plain steps after a drafting step that pay its switch (switch_first, then switch_each)


class Machine:
    """Step times: the table's, times lognormal noise, times the burst factor at ``now``."""

    def __init__(self, m: dict, sigma: float, seed: int, burst: tuple[float, float, float] | None, noise: int = 0):
        self.m, self.sigma = m, sigma
        self.rng = random.Random(seed * 1000 + noise)
        self.now = 0.0
        self.after = SWITCH  # plain steps since the last drafting step
        self.burst = burst
        self.edges: list[float] = []  # slow intervals: [start, end) pairs, in ms
        if burst:
            plain = m["verify"][1]
            tr, t = random.Random(seed * 7919 + 1), 0.0
            while len(self.edges) < 200_000:
                t += tr.expovariate(1.0 / (burst[0] * plain))
                self.edges.append(t)
                t += tr.expovariate(1.0 / (burst[1] * plain))
                self.edges.append(t)

    def _noise(self) -> float:
        f = math.exp(self.rng.gauss(0.0, self.sigma))
        if self.burst and bisect.bisect_right(self.edges, self.now) % 2 == 1:
            f *= self.burst[2]
        return f

    def step(self, k: int, deferred: int = 0) -> tuple[float, float, float]:
        """(target pass, drafter pass, wall) of a step drafting ``k``."""
        m = self.m
        verify = m["verify"][1 + k] * self._noise()
        if k:
            self.after = 0
            draft = m["draft"] * self._noise()
            return verify, draft, verify + draft + m["other_d"] + m["inject_row"] * deferred
        other = m["other_p"]
        if self.after == 0:
            other += m["switch_first"]
        elif self.after < SWITCH:
            other += m["switch_each"]
        self.after += 1
        return verify, 0.0, verify + other


def calibrated(m: dict, miscal: tuple[float, float] = (1.0, 1.0)) -> CostModel:
    """The policy's calibration: the table's passes, the drafter's times ``miscal[0]`` and
    the target's over more than one row times ``miscal[1]`` (a calibration that
    misjudged drafting steps, as one at a noisy moment or on a compute-bound target can)."""
    rows = list(range(1, BLOCK + 1))
    verify = [m["verify"][r] * (1.0 if r == 1 else miscal[1]) for r in rows]
    return CostModel(rows, verify, rows, [m["draft"] * miscal[0]] * BLOCK, BLOCK)


def run_adaptive(
    traces: Sequence[Sequence[int]],
    mach: Machine,
    miscal: tuple[float, float] = (1.0, 1.0),
    per_prompt: list[float] | None = None,
) -> float:
    """Total ms of the generations, in order, through one DraftPolicy (its state carries,
    as an engine's does), driven as Engine._step drives a lone sequence whose reader
    waits for the end. ``per_prompt``: each generation's ms appended there."""
    m = mach.m
    pol = DraftPolicy(calibrated(m, miscal), BLOCK - 1, BLOCK)
    n_run = max(1, min(256, int(RUN_MS / m["verify"][1])))
    total = 0.0
    for a in traces:
        start = total
        st = pol.new_sequence()
        ntok = off = 0
        while ntok < OSL:
            budget = OSL - ntok - 1
            if st.quiet == 0:
                total += m["py_choose"]  # a weighing
            k = pol.choose([st], [min(BLOCK - 1, budget)], [0])[0]
            if k == 0 and (n := min(n_run, st.quiet, budget + 1)) > 1:  # a run of plain steps
                vs, ws = [], []
                for _ in range(n):
                    mach.now = total
                    v, _, w = mach.step(0)
                    vs.append(v)
                    ws.append(w + m["py_run"])
                    total += ws[-1]
                ntok, off = ntok + n, off + n
                pol.observe([st], [Outcome(0, 0, 0)], sum(vs) / n, 0.0, sum(ws) / n, n)
                continue
            acc = min(k, a[ntok])
            mach.now = total
            v, d, w = mach.step(k, off if k else 0)
            w += m["py_single"]
            off = 0 if k else off + 1
            total += w
            ntok += acc + 1
            pol.observe([st], [Outcome(k, k, acc)], v, d, w)
        if per_prompt is not None:
            per_prompt.append(total - start)
    return total


def run_fixed(traces: Sequence[Sequence[int]], mach: Machine, k: int, per_prompt: list[float] | None = None) -> float:
    """Total ms of the generations at a fixed draft_max ``k`` (0: the target alone, in runs);
    ``per_prompt``: each generation's ms appended there."""
    m, total = mach.m, 0.0
    for a in traces:
        start = total
        ntok = 0
        while ntok < OSL:
            kk = min(k, OSL - ntok - 1)
            mach.now = total
            total += mach.step(kk)[2] + (m["py_run"] if k == 0 else m["py_single"])
            ntok += min(kk, a[ntok]) + 1
        if per_prompt is not None:
            per_prompt.append(total - start)
    return total


def evaluate(
    traces: Sequence[Sequence[int]],
    m: dict,
    seeds: int = 5,
    sigma: float = 0.05,
    burst: tuple[float, float, float] | None = None,
    miscal: tuple[float, float] = (1.0, 1.0),
    paired: dict[str, float] | None = None,
) -> dict[str, float]:
    """Each engine's speed over the target alone (by total time, mean over seeds; each
    seed shuffles the prompts and draws the noise every engine meets). ``paired``: filled
    with the adaptive engine's speed over each other engine as the bench pairs runs, the
    median over prompts of their ratios (mean over seeds)."""
    out: dict[str, list[float]] = {}
    pairs: dict[str, list[float]] = {}
    for s in range(seeds):
        order = list(traces)
        random.Random(s).shuffle(order)
        times: dict[str, list[float]] = {name: [] for name in ["f0", *(f"f{k}" for k in range(1, BLOCK)), "adaptive"]}
        t = run_fixed(order, Machine(m, sigma, s, burst), 0, times["f0"])
        for name, ms in [
            (f"f{k}", run_fixed(order, Machine(m, sigma, s, burst), k, times[f"f{k}"])) for k in range(1, BLOCK)
        ] + [("adaptive", run_adaptive(order, Machine(m, sigma, s, burst, noise=1), miscal, times["adaptive"]))]:
            out.setdefault(name, []).append(t / ms)
        for name, ms in times.items():
            if name != "adaptive":
                ratios = [b / a for a, b in zip(times["adaptive"], ms, strict=True)]
                pairs.setdefault(name, []).append(statistics.median(ratios))
    if paired is not None:
        paired.update({k: statistics.mean(v) for k, v in pairs.items()})
    return {k: statistics.mean(v) for k, v in out.items()}


def record_traces(workload: str, n: int, target: str, draft: str, positions: int = OSL) -> list[list[int]]:
    """Per prompt, what a full draft keeps at each of the first ``positions`` positions of
    the target's greedy output (the prefix prefilled, then one step)."""
    from pydflash import Llama
    from pydflash.bench.tasks import prompts
    from pydflash.bench.workload import text_codec

    with Llama(target, draft=draft, n_ctx=1024, n_batch=512) as pair:
        core = pair._engine._core
        out = []
        for p in prompts(workload, *text_codec(pair), 128, n):
            ids = pair.tokenize(p)
            gen = pair.generate(
                ids, max_tokens=positions + BLOCK, ignore_eos=True, draft_max=0, cache_prompt=False
            ).tokens
            a = []
            for i in range(positions):
                core.prefill(ids + gen[:i], False, 0)
                a.append(core.step(BLOCK - 1, seq=0).n_accepted)
            out.append(a)
        return out


def measure_costs(target: str, draft: str, steps: int = 24) -> dict:
    """A machine table: each draft_max's median pass times over ``steps`` steps of a prose
    prompt (the overheads it does not time are the embedded table's)."""
    from pydflash import Llama
    from pydflash.bench.tasks import prompts
    from pydflash.bench.workload import text_codec

    with Llama(target, draft=draft, n_ctx=1024, n_batch=512) as pair:
        core = pair._engine._core
        ids = pair.tokenize(prompts("prose", *text_codec(pair), 128, 1)[0])
        rows: dict[int, list[tuple[float, float, float]]] = {}
        for k in range(BLOCK):
            core.prefill(ids, False, 0)
            for j in range(steps):
                r = core.step(k, seq=0)
                if j >= 4:  # past the graph rebuild for this size
                    rows.setdefault(k, []).append((r.t_verify_ms, r.t_draft_ms, r.t_inject_ms))
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in rows.items()}
    m = dict(MACHINES["embedded"])
    m["verify"] = [0.0] + [med[k][0] for k in range(BLOCK)]
    m["draft"] = statistics.median(med[k][1] for k in range(1, BLOCK))
    m["other_d"] = statistics.median(med[k][2] for k in range(1, BLOCK))
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    models = Path(__file__).resolve().parent.parent / "src" / "pydflash" / "models"
    t = sub.add_parser("traces", help="record acceptance traces with the embedded pair")
    t.add_argument("--workload", choices=["code", "prose", "edit"], required=True)
    t.add_argument("--prompts", type=int, default=40)
    t.add_argument("--out", required=True)
    c = sub.add_parser("costs", help="measure a machine table on a pair")
    c.add_argument("--target", default=str(models / "stdlib-code-target.gguf"))
    c.add_argument("--draft", default=str(models / "stdlib-code-dflash.gguf"))
    c.add_argument("--out", required=True)
    r = sub.add_parser("run", help="simulate the adaptive policy and every fixed draft_max")
    r.add_argument("traces")
    r.add_argument("--machine", default="padded", help="padded, embedded, or a table from `costs`")
    r.add_argument("--seeds", type=int, default=5)
    r.add_argument("--sigma", type=float, default=0.05, help="per-step lognormal noise")
    r.add_argument("--burst", help="NORMAL,SLOW,FACTOR: slow intervals (mean lengths in plain steps)")
    r.add_argument(
        "--miscalibrate", help="DRAFT,VERIFY: the calibration's drafter pass and multi-row target passes, scaled"
    )
    r.add_argument("--set", action="append", default=[], help="NAME=VALUE: a draft_length.policy constant")
    args = ap.parse_args(argv)
    if args.cmd == "traces":
        tr = record_traces(
            args.workload,
            args.prompts,
            str(models / "stdlib-code-target.gguf"),
            str(models / "stdlib-code-dflash.gguf"),
        )
        Path(args.out).write_text(json.dumps(tr))
        print(f"{len(tr)} traces, mean tokens kept by a full draft {statistics.mean(map(statistics.mean, tr)):.2f}")
        return 0
    if args.cmd == "costs":
        Path(args.out).write_text(json.dumps(measure_costs(args.target, args.draft)))
        return 0
    m = MACHINES[args.machine] if args.machine in MACHINES else json.loads(Path(args.machine).read_text())
    for kv in args.set:
        name, _, value = kv.partition("=")
        if not hasattr(dp, name):
            ap.error(f"--set: draft_length.policy has no {name}")
        setattr(dp, name, type(getattr(dp, name))(value))

    def floats(text: str, form: str) -> tuple[float, ...]:
        """A comma-separated option of as many numbers as ``form`` names."""
        vals = tuple(float(x) for x in text.split(","))
        if len(vals) != form.count(",") + 1:
            ap.error(form)
        return vals

    burst = floats(args.burst, "--burst takes NORMAL,SLOW,FACTOR") if args.burst else None
    miscal = floats(args.miscalibrate, "--miscalibrate takes DRAFT,VERIFY") if args.miscalibrate else (1.0, 1.0)
    traces = json.loads(Path(args.traces).read_text())
    paired: dict[str, float] = {}
    res = evaluate(traces, m, args.seeds, args.sigma, burst, miscal=miscal, paired=paired)
    best = max((k for k in res if k.startswith("f")), key=res.__getitem__)
    print("  ".join(f"{k} {v:.3f}" for k, v in res.items()))
    print(f"adaptive / best fixed ({best}): {res['adaptive'] / res[best]:.3f}")
    print("paired by prompt (median of ratios), adaptive / " + "  ".join(f"{k} {v:.3f}" for k, v in paired.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
