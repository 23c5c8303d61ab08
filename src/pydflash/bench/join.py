"""The serving bench's long-prompt-joins workload: N streams decode steadily
(short prompts, long outputs); once all of them stream, one request with a
long prompt joins. How much does its prefill stall the running streams?

The join window runs from the joiner's send to its first token plus a margin.
A gap between two deliveries of a running stream belongs to the window when
the two overlap (it ends after the window opens and starts before it closes).
Two figures come from the same gaps, for every engine alike:

- ITL: a delivery of k tokens after a gap g counts k latencies of g / k (as the
  sweep counts them: a speculative step's tokens share its time);
- the gap itself: the pause a reader of the stream sees, whatever the number
  of tokens that end it (a stall is a stall however many tokens follow)."""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .servers import PYDFLASH
from .serving_report import Row, percentile
from .sse_client import StreamRecord, stream_completion

JOINER_OSL = 16  # the joiner's output: its time to first token is the figure
SETTLE_EVENTS = 4  # events every stream has had (past its prefill, decoding) before the joiner is sent

Body = Callable[[str, int], dict[str, Any]]  # (prompt, max_tokens) -> request


def run_join(
    url: str, prompts: Sequence[str], join_prompt: str, osl: int, body: Body, settle_events: int = SETTLE_EVENTS
) -> dict[str, Any]:
    """One stream per prompt (``osl`` tokens each), started together; the
    joiner (``join_prompt``) is sent once every stream has had ``settle_events``
    events (or ended). Returns {"streams": records, "joiner": record}."""
    streams = len(prompts)
    started = threading.Barrier(streams + 1)
    settled = [threading.Event() for _ in range(streams)]
    out: list[StreamRecord | None] = [None] * streams
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        def on_event(n: int) -> None:
            if n >= settle_events:
                settled[i].set()

        try:
            started.wait()
            out[i] = stream_completion(url, body(prompts[i], osl), on_event=on_event)
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)
        finally:
            settled[i].set()  # the joiner must not wait on a stream that ended or failed

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    started.wait()
    for ev in settled:
        ev.wait()
    joiner: StreamRecord | None = None
    if not errors:
        joiner = stream_completion(url, body(join_prompt, JOINER_OSL))
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return {"streams": [r for r in out if r is not None], "joiner": joiner}


def gaps(record: StreamRecord, start: float | None = None, end: float | None = None) -> list[tuple[float, int]]:
    """The (gap s, tokens that end it) of a record's deliveries after its first,
    where the gap overlaps [start, end] (perf_counter times; None: unbounded)."""
    out = []
    t = [record.t_sent + d.t_s for d in record.deliveries]
    for k in range(1, len(t)):
        if (start is None or t[k] > start) and (end is None or t[k - 1] < end):
            out.append((t[k] - t[k - 1], record.deliveries[k].n_tokens))
    return out


def window(run: Mapping[str, Any], margin_s: float) -> tuple[float, float]:
    """The join window: the joiner's send to its first token + ``margin_s``."""
    j: StreamRecord = run["joiner"]
    return j.t_sent, j.t_sent + j.ttft_s + margin_s


def _stats(prefix: str, pairs: Sequence[tuple[float, int]]) -> Row:
    itl = [g / n for g, n in pairs for _ in range(n)]
    gap = [g for g, _ in pairs]
    ms = {"p50": 50.0, "p99": 99.0, "max": 100.0}
    row: Row = {f"{prefix}gaps": len(gap)}
    for name, q in ms.items():
        for what, values in (("itl", itl), ("gap", gap)):
            v = percentile(values, q)
            row[f"{prefix}{what}_ms_{name}"] = None if v is None else v * 1e3
    return row


def join_rows(runs: Sequence[dict[str, Any]], margin_s: float) -> list[Row]:
    """One row per engine: the running streams' ITL and delivery gaps in the
    join window and over their whole run (pooled over repeats), the joiner's
    time to first token and the window's length (medians over repeats), and
    whether every stream was still streaming when the window closed."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[run["engine"]].append(run)
    rows = []
    for engine, group in sorted(groups.items(), key=lambda kv: kv[0] != PYDFLASH):
        inside: list[tuple[float, int]] = []
        overall: list[tuple[float, int]] = []
        outlasted = True
        for run in group:
            start, end = window(run, margin_s)
            for rec in run["streams"]:
                inside += gaps(rec, start, end)
                overall += gaps(rec)
                outlasted &= rec.t_sent + rec.e2e_s >= end
        joiner: list[StreamRecord] = [run["joiner"] for run in group]
        rows.append(
            {
                "workload": "join",
                "engine": engine,
                "streams": len(group[0]["streams"]),
                "repeats": len(group),
                "join_prompt_tokens": statistics.median(int(j.usage.get("prompt_tokens", 0)) for j in joiner),
                "joiner_ttft_ms": statistics.median(j.ttft_s * 1e3 for j in joiner),
                "window_ms": statistics.median((j.ttft_s + margin_s) * 1e3 for j in joiner),
                "streams_outlasted_window": outlasted,
            }
            | _stats("window_", inside)
            | _stats("", overall)
        )
    return rows


JOIN_RATIOS = ("window_itl_ms_p99", "window_gap_ms_p99", "window_gap_ms_max", "joiner_ttft_ms")


def join_ratios(rows: Sequence[Row]) -> list[Row]:
    """pydflash / each llama-server engine (< 1: pydflash stalls its streams less):
    {"workload": "join", "vs": {engine: {metric: ratio}}}; [] without pydflash or a peer."""
    by = {r["engine"]: r for r in rows if r["workload"] == "join"}
    p = by.get(PYDFLASH)
    others = {e: r for e, r in by.items() if e != PYDFLASH}
    if p is None or not others:
        return []
    vs = {e: {m: _ratio(p[m], r[m]) for m in JOIN_RATIOS} for e, r in others.items()}
    return [{"workload": "join", "vs": vs}]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _f(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def join_lines(entries: Sequence[Row]) -> list[str]:
    """join_ratios() as sentences."""
    return [
        f"long prompt joins: pydflash / {e}: running streams' ITL p99 {_f(r['window_itl_ms_p99'], '.3f')}, "
        f"delivery gap p99 {_f(r['window_gap_ms_p99'], '.3f')}, max {_f(r['window_gap_ms_max'], '.3f')}; "
        f"joiner's TTFT {_f(r['joiner_ttft_ms'], '.3f')}"
        for entry in entries
        for e, r in entry["vs"].items()
    ]


def join_table(rows: Sequence[Row]) -> str:
    """The join rows as text: in the window, then over the streams' whole run (ms)."""
    rows = [r for r in rows if r["workload"] == "join"]
    if not rows:
        return ""
    lines = [
        f"{'engine':18} {'joiner ttft':>11} {'window':>7} | {'in window: itl p50':>18} {'p99':>7} {'gap p99':>7} "
        f"{'max':>7} | {'overall: itl p50':>16} {'p99':>7} {'gap p99':>7} {'max':>7}"
    ]
    for r in rows:
        lines.append(
            f"{r['engine']:18} {r['joiner_ttft_ms']:11.1f} {r['window_ms']:7.1f} | "
            f"{_f(r['window_itl_ms_p50'], '18.2f'):>18} {_f(r['window_itl_ms_p99'], '7.2f'):>7} "
            f"{_f(r['window_gap_ms_p99'], '7.2f'):>7} {_f(r['window_gap_ms_max'], '7.2f'):>7} | "
            f"{_f(r['itl_ms_p50'], '16.2f'):>16} {_f(r['itl_ms_p99'], '7.2f'):>7} "
            f"{_f(r['gap_ms_p99'], '7.2f'):>7} {_f(r['gap_ms_max'], '7.2f'):>7}"
            + ("" if r["streams_outlasted_window"] else "  (a stream ended inside the window: raise --join-osl)")
        )
    return "\n".join(lines)
