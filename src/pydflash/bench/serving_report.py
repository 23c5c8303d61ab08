"""The serving bench's figures: percentiles, one row per (engine, concurrency)
and per (engine, turn), the ratios of pydflash to each llama-server engine
(with DFlash, and without speculation) and to the better of the two, and tables."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from .servers import ENGINES, LLAMA_ENGINES, LLAMA_SERVER, LLAMA_SERVER_PLAIN, PYDFLASH
from .sse_client import StreamRecord

Row = dict[str, Any]  # JSON values


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks (numpy's
    default); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in 0..100, got {q}")
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _acceptance(records: Sequence[StreamRecord]) -> float | None:
    drafted = sum(int(r.timings.get("draft_n", 0)) for r in records)
    accepted = sum(int(r.timings.get("draft_n_accepted", 0)) for r in records)
    return accepted / drafted if drafted else None


def steady_tok_s(records: Sequence[StreamRecord], streams: int) -> float | None:
    """Output tok/s while every one of ``streams`` closed-loop streams is running: from the
    last first token of the first round of requests to the first end of the last round (each
    stream sends its requests one after another, so the first ``streams`` sent are the first
    round, the last ``streams`` the last). The run's wall time also holds the ramp and the
    tail, where speculation leaves streams that finished early waiting on slower ones.
    None where no such window exists (one round that ends before it fills)."""
    by_sent = sorted(records, key=lambda r: r.t_sent)
    first, last = by_sent[:streams], by_sent[-streams:]
    if len(records) < streams or any(not r.deliveries for r in first):
        return None
    t0 = max(r.t_sent + r.deliveries[0].t_s for r in first)
    t1 = min(r.t_done for r in last)
    if t1 <= t0:
        return None
    n = sum(d.n_tokens for r in records for d in r.deliveries if t0 < r.t_sent + d.t_s <= t1)
    return n / (t1 - t0)


def sweep_rows(runs: Sequence[dict[str, Any]], isl: int, osl: int) -> list[Row]:
    """One row per (engine, concurrency): output tok/s per run (all streams'
    tokens over the run's wall time; median, min, max over repeats), and over
    every request of every repeat: TTFT and ITL percentiles, per-request tok/s."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["engine"], run["concurrency"])].append(run)
    rows = []
    for (engine, n), group in sorted(groups.items(), key=lambda kv: (kv[0][1], ENGINES.index(kv[0][0]))):
        records: list[StreamRecord] = [r for run in group for r in run["records"]]
        out_tok_s = [sum(r.n_tokens for r in run["records"]) / run["wall_s"] for run in group]
        steady = [x for run in group if (x := steady_tok_s(run["records"], n)) is not None]
        ttft = [r.ttft_s for r in records]
        itl = [x for r in records for x in r.itl_s]
        rows.append(
            {
                "workload": "concurrency",
                "engine": engine,
                "concurrency": n,
                "isl": isl,
                "osl": osl,
                "repeats": len(group),
                "requests": len(records),
                "output_tok_s": statistics.median(out_tok_s),
                "output_tok_s_min": min(out_tok_s),
                "output_tok_s_max": max(out_tok_s),
                "output_tok_s_self": self_ratio(out_tok_s),
                "steady_tok_s": statistics.median(steady) if steady else None,
                "ttft_ms_p50": _ms(percentile(ttft, 50)),
                "ttft_ms_p99": _ms(percentile(ttft, 99)),
                "itl_ms_p50": _ms(percentile(itl, 50)),
                "itl_ms_p99": _ms(percentile(itl, 99)),
                "request_tok_s_p50": percentile([r.request_tok_s for r in records], 50),
                "decode_tok_s_p50": percentile([r.decode_tok_s for r in records], 50),
                "tokens_per_delivery": sum(r.n_tokens for r in records)
                / max(sum(len(r.deliveries) for r in records), 1),
                "acceptance_rate": _acceptance(records),
                "all_osl_tokens": all(r.n_tokens == osl for r in records),
                "isl_measured": statistics.median(int(r.usage.get("prompt_tokens", 0)) for r in records),
                "token_counts": dict(Counter(r.token_counts for r in records)),
            }
        )
    return rows


def self_ratio(values: Sequence[float]) -> float | None:
    """An engine against itself in one run: the median of its even repeats over that of its
    odd ones (alternated with the other engines, each half saw the same stretches of a shared
    machine); None under 2 repeats."""
    return statistics.median(values[0::2]) / statistics.median(values[1::2]) if len(values) > 1 else None


def turn_rows(conversations: Sequence[dict[str, Any]], osl: int) -> list[Row]:
    """One row per (engine, turn): medians over repeats of time to first token
    and of the prompt tokens taken from the cache (cache_n) or evaluated (prompt_n)."""
    groups: dict[tuple[str, int], list[StreamRecord]] = defaultdict(list)
    for conv in conversations:
        for k, rec in enumerate(conv["records"]):
            groups[(conv["engine"], k + 1)].append(rec)
    rows = []
    for (engine, turn), recs in sorted(groups.items(), key=lambda kv: (kv[0][1], ENGINES.index(kv[0][0]))):
        ttft = [r.ttft_s * 1e3 for r in recs]
        rows.append(
            {
                "workload": "multi-turn",
                "engine": engine,
                "turn": turn,
                "osl": osl,
                "repeats": len(recs),
                "prompt_tokens": statistics.median(int(r.usage.get("prompt_tokens", 0)) for r in recs),
                "cache_n": statistics.median(int(r.timings.get("cache_n", 0)) for r in recs),
                "prompt_n": statistics.median(int(r.timings.get("prompt_n", 0)) for r in recs),
                "ttft_ms": statistics.median(ttft),
                "ttft_ms_min": min(ttft),
                "ttft_ms_max": max(ttft),
                "acceptance_rate": _acceptance(recs),
            }
        )
    return rows


def same_outputs(
    runs: Sequence[dict[str, Any]], conversations: Sequence[dict[str, Any]], other: str = LLAMA_SERVER
) -> dict[str, list[int]]:
    """Greedy outputs of pydflash and ``other`` on the same prompt, compared:
    {"c<N>" or "turn<k>": [identical, compared]} (first repeat of each)."""
    texts: dict[tuple[str, int, str], str] = {}
    for run in runs:
        if run["repeat"] == 0:
            for i, r in enumerate(run["records"]):
                texts[(f"c{run['concurrency']}", i, run["engine"])] = r.text
    for conv in conversations:
        if conv["repeat"] == 0:
            for k, r in enumerate(conv["records"]):
                texts[(f"turn{k + 1}", 0, conv["engine"])] = r.text
    out: dict[str, list[int]] = {}
    for (key, i, engine), text in texts.items():
        theirs = texts.get((key, i, other))
        if engine == PYDFLASH and theirs is not None:
            counts = out.setdefault(key, [0, 0])
            counts[0] += text == theirs
            counts[1] += 1
    return out


_SWEEP_RATIOS = (
    "output_tok_s",
    "steady_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "request_tok_s_p50",
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def ratios(rows: Sequence[Row], same: Mapping[str, Mapping[str, list[int]]]) -> list[Row]:
    """pydflash / each llama-server engine measured, metric by metric (> 1 is
    better for tok/s, worse for latencies): at the top level against
    llama-server with DFlash, under "plain" against llama-server without
    speculation; and for the sweep "vs_best": output tok/s against the better
    of the two at that level (the goal: >= 1). ``same``: same_outputs() by engine."""
    by = {
        (r["workload"], r.get("concurrency", r.get("turn")), r["engine"]): r
        for r in rows
        if r["workload"] in ("concurrency", "multi-turn")
    }
    out = []
    for (workload, key, engine), p in by.items():
        others = {e: by[(workload, key, e)] for e in LLAMA_ENGINES if (workload, key, e) in by}
        if engine != PYDFLASH or not others:
            continue
        tag = f"c{key}" if workload == "concurrency" else f"turn{key}"
        entry: Row = {"workload": workload, "concurrency" if workload == "concurrency" else "turn": key}
        for e, other in others.items():
            if workload == "concurrency":
                part: Row = {m: _ratio(p.get(m), other.get(m)) for m in _SWEEP_RATIOS}
            else:
                part = {"ttft_ms": _ratio(p["ttft_ms"], other["ttft_ms"]), "cache_n": [p["cache_n"], other["cache_n"]]}
            part["same_outputs"] = same.get(e, {}).get(tag)
            if e == LLAMA_SERVER:
                entry |= part
            else:
                entry["plain"] = part
        if workload == "concurrency":
            best = max(others, key=lambda e: others[e]["output_tok_s"])
            entry["vs_best"] = {"engine": best, "output_tok_s": _ratio(p["output_tok_s"], others[best]["output_tok_s"])}
            # the noise band: how far an engine of this level differed from itself
            if selves := [r for x in (p, *others.values()) if (r := x.get("output_tok_s_self"))]:
                entry["vs_best"]["noise"] = max(max(r, 1 / r) for r in selves) - 1
            if all(o.get("steady_tok_s") for o in others.values()):  # the same, while every stream runs
                sbest = max(others, key=lambda e: others[e]["steady_tok_s"])
                entry["vs_best"]["steady"] = {
                    "engine": sbest,
                    "steady_tok_s": _ratio(p.get("steady_tok_s"), others[sbest]["steady_tok_s"]),
                }
        out.append(entry)
    return out


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _parts(entry: Row) -> list[tuple[str, Row]]:
    """(llama engine, its ratios) of a ratios() entry."""
    out = [(LLAMA_SERVER, entry)] if "same_outputs" in entry else []
    return out + ([(LLAMA_SERVER_PLAIN, entry["plain"])] if "plain" in entry else [])


def ratio_lines(entries: Sequence[Row]) -> list[str]:
    """The ratios as sentences."""
    lines = []
    for e in entries:
        for other, r in _parts(e):
            same = r.get("same_outputs")
            tail = f"; identical outputs {same[0]}/{same[1]}" if same else ""
            if e["workload"] == "concurrency":
                lines.append(
                    f"concurrency {e['concurrency']}: pydflash / {other} output tok/s {_f(r['output_tok_s'], '.3f')}, "
                    f"TTFT p50 {_f(r['ttft_ms_p50'], '.3f')}, ITL p50 {_f(r['itl_ms_p50'], '.3f')}, "
                    f"ITL p99 {_f(r['itl_ms_p99'], '.3f')}{tail}"
                )
            else:
                lines.append(
                    f"multi-turn, turn {e['turn']}: pydflash / {other} TTFT {_f(r['ttft_ms'], '.3f')} "
                    f"(cached prompt tokens {r['cache_n'][0]:.0f} vs {r['cache_n'][1]:.0f}){tail}"
                )
        if "vs_best" in e:
            best = e["vs_best"]
            lines.append(
                f"concurrency {e['concurrency']}: pydflash / the better llama-server ({best['engine']}) output tok/s "
                f"{_f(best['output_tok_s'], '.3f')}{_verdict(best)}"
            )
            if "steady" in best:
                st = best["steady"]
                lines.append(
                    f"concurrency {e['concurrency']}: while every stream runs, pydflash / the better llama-server "
                    f"({st['engine']}) output tok/s {_f(st['steady_tok_s'], '.3f')}"
                )
    return lines


def _verdict(best: Row) -> str:
    """The goal (>= 1), where a ratio below it lies inside the noise band, or beyond it."""
    r, noise = best["output_tok_s"], best.get("noise")
    if r is None:
        return ""
    if r >= 1:
        return " (goal met)"
    if noise is not None and r >= 1 / (1 + noise):
        return f" (below 1, inside the noise band: an engine differed from itself by {noise:.1%})"
    return " (below)" if noise is None else f" (below, beyond the noise band of {noise:.1%})"


def table(rows: Sequence[Row]) -> str:
    """The rows as text: the sweep, then the conversation's turns; under each
    llama-server engine's row, pydflash / that engine."""
    lines = []
    sweep = [r for r in rows if r["workload"] == "concurrency"]
    if sweep:
        lines.append(
            f"{'engine':18} {'conc':>4} {'reqs':>4} {'out tok/s':>9} {'(min-max)':>15} {'steady':>9} {'ttft p50':>8} "
            f"{'p99 ms':>8} "
            f"{'itl p50':>7} {'p99 ms':>7} {'req t/s':>7} {'tok/dlv':>7} {'accept':>6}"
        )
        for r in sweep:
            spread = f"({r['output_tok_s_min']:.1f}-{r['output_tok_s_max']:.1f})"
            lines.append(
                f"{r['engine']:18} {r['concurrency']:4d} {r['requests']:4d} {r['output_tok_s']:9.1f} {spread:>15} "
                f"{_f(r.get('steady_tok_s'), '9.1f'):>9} {_f(r['ttft_ms_p50'], '8.1f'):>8} "
                f"{_f(r['ttft_ms_p99'], '8.1f'):>8} "
                f"{_f(r['itl_ms_p50'], '7.2f'):>7} {_f(r['itl_ms_p99'], '7.2f'):>7} "
                f"{_f(r['request_tok_s_p50'], '7.1f'):>7} {r['tokens_per_delivery']:7.2f} "
                f"{_f(r['acceptance_rate'], '6.3f'):>6}"
            )
            p = _pydflash_row(sweep, r, "concurrency")
            if p is not None:
                q = {m: _f(_ratio(p.get(m), r.get(m)), ".3f") for m in _SWEEP_RATIOS}
                lines.append(
                    f"{_RATIO_LABEL[r['engine']]:18} {'':4} {'':4} {q['output_tok_s']:>9} {'':15} "
                    f"{q['steady_tok_s']:>9} {q['ttft_ms_p50']:>8} {q['ttft_ms_p99']:>8} "
                    f"{q['itl_ms_p50']:>7} {q['itl_ms_p99']:>7} "
                    f"{q['request_tok_s_p50']:>7}"
                )
    turns = [r for r in rows if r["workload"] == "multi-turn"]
    if turns:
        if lines:
            lines.append("")
        lines.append(
            f"{'engine':18} {'turn':>4} {'prompt':>7} {'cache_n':>7} {'prompt_n':>8} {'ttft ms':>8} {'(min-max)':>15}"
        )
        for r in turns:
            spread = f"({r['ttft_ms_min']:.1f}-{r['ttft_ms_max']:.1f})"
            lines.append(
                f"{r['engine']:18} {r['turn']:4d} {r['prompt_tokens']:7.0f} {r['cache_n']:7.0f} {r['prompt_n']:8.0f} "
                f"{r['ttft_ms']:8.1f} {spread:>15}"
            )
            p = _pydflash_row(turns, r, "turn")
            if p is not None:
                lines.append(
                    f"{_RATIO_LABEL[r['engine']]:18} {'':4} {'':7} {'':7} {'':8} "
                    f"{_f(_ratio(p['ttft_ms'], r['ttft_ms']), '8.3f')}"
                )
    return "\n".join(lines)


_RATIO_LABEL = {LLAMA_SERVER: "  ratio p/l", LLAMA_SERVER_PLAIN: "  ratio p/plain"}


def _pydflash_row(rows: Sequence[Row], r: Row, key: str) -> Row | None:
    """pydflash's row of the same level or turn, when ``r`` is a llama-server engine's."""
    if r["engine"] not in LLAMA_ENGINES:
        return None
    return next((p for p in rows if p["engine"] == PYDFLASH and p[key] == r[key]), None)
