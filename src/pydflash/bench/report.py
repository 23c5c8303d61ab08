"""Turn raw bench measurements into rows (medians, spread, ratios), a table,
JSON, CSV and PNG charts."""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

Row = dict[str, Any]  # one configuration's figures (COLUMNS and more); JSON values

TARGET_ONLY = "pydflash-target"
DFLASH = "pydflash-dflash"
ADAPTIVE = "pydflash-adaptive"  # DFlash with the adaptive draft length (draft_max None)
NATIVE = "llama.cpp-dflash"
LCP = "llama-cpp-python"

COLUMNS = [
    "engine",
    "isl",
    "osl",
    "draft_max",
    "repeats",
    "decode_tok_s",
    "decode_tok_s_min",
    "decode_tok_s_max",
    "prefill_tok_s",
    "ttft_ms",
    "itl_ms",
    "acceptance_rate",
    "tau",
    "mean_draft_len",
    "speedup",
    "roofline_fraction",
    "rss_peak_mib",
    "same_tokens_as_target",
]


def aggregate(measurements: list[Row], roofline: dict[str, Any] | None = None) -> list[Row]:
    groups: dict[tuple[str, int, int, int | None], list[Row]] = defaultdict(list)
    for m in measurements:
        groups[(m["engine"], m["isl_requested"], m["osl"], m["draft_max"])].append(m)
    rows = []
    for (engine, isl, osl, dm), ms in groups.items():
        tok_s = [m["n_generated"] / m["decode_s"] for m in ms if m["decode_s"] > 0]
        drafted = sum(m["n_drafted"] for m in ms)
        # run by run (repeat r: every engine decoded the same prompt), for paired ratios
        by_repeat = {m["repeat"]: m["n_generated"] / m["decode_s"] for m in ms if "repeat" in m and m["decode_s"] > 0}
        row = {
            "engine": engine,
            "isl": isl,
            "osl": osl,
            "draft_max": dm,
            "repeats": len(ms),
            "decode_tok_s": statistics.median(tok_s),
            "decode_tok_s_min": min(tok_s),
            "decode_tok_s_max": max(tok_s),
            "decode_tok_s_runs": [by_repeat[r] for r in sorted(by_repeat)] if by_repeat else None,
            "repeats_run": sorted(by_repeat) if by_repeat else None,
            "prefill_tok_s": statistics.median(m["isl"] / m["prefill_s"] for m in ms if m["prefill_s"] > 0),
            "ttft_ms": 1e3 * statistics.median(m["ttft_s"] for m in ms),
            "itl_ms": 1e3 * statistics.median(m["decode_s"] / m["n_generated"] for m in ms),
            "acceptance_rate": sum(m["n_accepted"] for m in ms) / drafted if drafted else None,
            "tau": sum(m["n_generated"] for m in ms) / max(sum(m["n_steps"] for m in ms), 1),
            # the draft length steps asked for (the adaptive policy's choice, or the pinned one)
            "mean_draft_len": statistics.fmean(m["mean_draft_len"] for m in ms) if "mean_draft_len" in ms[0] else None,
            "rss_peak_mib": max(m["rss_peak_bytes"] for m in ms) / 2**20,
            "isl_measured": statistics.median(m["isl"] for m in ms),
            "same_tokens_as_target": all(m.get("same_tokens_as_target", True) for m in ms)
            if any("same_tokens_as_target" in m for m in ms)
            else None,
        }
        if engine in (TARGET_ONLY, DFLASH, ADAPTIVE) and ms[0].get("memory"):
            row["memory"] = ms[0]["memory"]
        rows.append(row)
    base = {(r["isl"], r["osl"]): r["decode_tok_s"] for r in rows if r["engine"] == TARGET_ONLY}
    for r in rows:
        b = base.get((r["isl"], r["osl"]))
        r["speedup"] = r["decode_tok_s"] / b if b else None
        r["roofline_fraction"] = None
        if roofline and r["engine"] in roofline.get("limit_tok_s", {}).get(str(r["isl"]), {}):
            limit = roofline["limit_tok_s"][str(r["isl"])][r["engine"]]
            r["roofline_fraction"] = r["decode_tok_s"] / limit if limit else None
    rows.sort(key=lambda r: (r["isl"], r["draft_max"] or 0, r["engine"]))
    return rows


def goals(rows: list[Row]) -> list[str]:
    """The issue's three goals, as measured ratios."""
    out = []
    by = {(r["engine"], r["isl"], r["draft_max"]): r for r in rows}
    pairs = [(r, n) for r in rows if r["engine"] == DFLASH if (n := by.get((NATIVE, r["isl"], r["draft_max"])))]
    if pairs:
        ratios = [p["decode_tok_s"] / n["decode_tok_s"] for p, n in pairs]
        detail = ", ".join(
            f"isl {p['isl']} dm {p['draft_max']}: {x:.3f}" for (p, _), x in zip(pairs, ratios, strict=True)
        )
        out.append(
            f"pydflash DFlash / llama.cpp native DFlash decode tok/s: median {statistics.median(ratios):.3f}"
            f" (goal >= 0.97) [{detail}]"
        )
    lcp = [(r, t) for r in rows if r["engine"] == LCP if (t := by.get((TARGET_ONLY, r["isl"], 0)))]
    if lcp:
        ratios = [t["decode_tok_s"] / x["decode_tok_s"] for x, t in lcp]
        out.append(
            f"pydflash target-only / llama-cpp-python decode tok/s: median {statistics.median(ratios):.3f}"
            f" (goal >= 1.0)"
        )
    out += [line for r in adaptive_ratios(rows) for line in _adaptive_lines(r)]
    best = max((r for r in rows if r["engine"] == DFLASH and r["speedup"]), key=lambda r: r["speedup"], default=None)
    if best:
        out.append(
            f"best pydflash DFlash speed-up over target-only: {best['speedup']:.2f}x at draft_max "
            f"{best['draft_max']}, isl {best['isl']} (goal >= 1.5x on the memory-bound target)"
        )
    return out


def _runs(a: Row, b: Row) -> tuple[dict[int, float], dict[int, float], list[int]]:
    """Each row's decode tok/s by run, and the runs both have (run r of every engine
    decodes prompt r)."""
    ra = dict(zip(a.get("repeats_run") or (), a.get("decode_tok_s_runs") or (), strict=True))
    rb = dict(zip(b.get("repeats_run") or (), b.get("decode_tok_s_runs") or (), strict=True))
    return ra, rb, sorted(set(ra) & set(rb))


def paired(a: Row, b: Row) -> float | None:
    """The median over the runs both rows have of a's decode tok/s over b's on the
    same prompt: the prompts' spread, wider than the engines' differences where
    acceptance varies by prompt, cancels."""
    ra, rb, both = _runs(a, b)
    return statistics.median(ra[r] / rb[r] for r in both) if both else None


def by_total(a: Row, b: Row) -> float | None:
    """a's speed over b's by their total decode time over the runs both have: what a
    user who runs every prompt waits for. Each run of a pydflash engine decodes OSL
    tokens (the end of generation ignored), so the times are inverse rates."""
    ra, rb, both = _runs(a, b)
    return sum(1.0 / rb[r] for r in both) / sum(1.0 / ra[r] for r in both) if both else None


def adaptive_ratios(rows: list[Row]) -> list[dict[str, Any]]:
    """Per workload (ISL, OSL) with an adaptive row: its decode tok/s over the best
    fixed draft_max measured there, over the default fixed one (block size - 1, the
    largest measured) and over the target alone (medians, measured side by side);
    the same run by run (``paired_*``: the median of the per-prompt ratios; the
    best fixed draft_max there is the one adaptive does worst against) and by total
    decode time (``total_*``, the same choice of best)."""
    out = []
    for a in (r for r in rows if r["engine"] == ADAPTIVE):
        fixed = [r for r in rows if r["engine"] == DFLASH and (r["isl"], r["osl"]) == (a["isl"], a["osl"])]
        target = next(
            (r for r in rows if r["engine"] == TARGET_ONLY and (r["isl"], r["osl"]) == (a["isl"], a["osl"])), None
        )
        best = max(fixed, key=lambda r: r["decode_tok_s"], default=None)
        default = max(fixed, key=lambda r: r["draft_max"] or 0, default=None)
        tok_s = a["decode_tok_s"]
        entry: dict[str, Any] = {
            "isl": a["isl"],
            "osl": a["osl"],
            "adaptive_tok_s": tok_s,
            "mean_draft_len": a.get("mean_draft_len"),
            "best_fixed_draft_max": best["draft_max"] if best else None,
            "fixed_draft_max_measured": sorted(r["draft_max"] for r in fixed),
            "over_best_fixed": tok_s / best["decode_tok_s"] if best else None,
            "default_draft_max": default["draft_max"] if default else None,
            "over_default_fixed": tok_s / default["decode_tok_s"] if default else None,
            "over_target_alone": tok_s / target["decode_tok_s"] if target else None,
        }
        for key, ratio in (("paired", paired), ("total", by_total)):
            per_fixed = {r["draft_max"]: ratio(a, r) for r in fixed}
            known = {d: v for d, v in per_fixed.items() if v is not None}
            worst = min(known, key=lambda d: known[d], default=None)
            entry[f"{key}_over_fixed"] = {str(d): v for d, v in sorted(per_fixed.items())}
            entry[f"{key}_best_fixed_draft_max"] = worst
            entry[f"{key}_over_best_fixed"] = known[worst] if worst is not None else None
            entry[f"{key}_over_default_fixed"] = per_fixed.get(default["draft_max"]) if default else None
            entry[f"{key}_over_target_alone"] = ratio(a, target) if target else None
        out.append(entry)
    return out


def _adaptive_lines(r: dict[str, Any]) -> list[str]:
    where = f"isl {r['isl']} osl {r['osl']}"
    lines = []
    if r["over_best_fixed"] is not None:
        lines.append(
            f"adaptive / best fixed draft_max ({r['best_fixed_draft_max']} of {r['fixed_draft_max_measured']}), "
            f"{where}: {r['over_best_fixed']:.3f} (goal >= 0.98)"
        )
    if r["over_default_fixed"] is not None:
        lines.append(
            f"adaptive / default fixed draft_max {r['default_draft_max']}, {where}: {r['over_default_fixed']:.3f} "
            "(goal >= 1.1 on at least one workload)"
        )
    if r["over_target_alone"] is not None:
        lines.append(f"adaptive / target alone, {where}: {r['over_target_alone']:.3f} (goal >= 0.98)")
    for key, label in (("paired", "paired by prompt (median of run-by-run ratios)"), ("total", "by total decode time")):
        parts = []
        if r.get(f"{key}_over_best_fixed") is not None:
            parts.append(
                f"its hardest fixed draft_max ({r[f'{key}_best_fixed_draft_max']}) {r[f'{key}_over_best_fixed']:.3f}"
            )
        if r.get(f"{key}_over_default_fixed") is not None:
            parts.append(f"default fixed {r[f'{key}_over_default_fixed']:.3f}")
        if r.get(f"{key}_over_target_alone") is not None:
            parts.append(f"target alone {r[f'{key}_over_target_alone']:.3f}")
        if parts:
            lines.append(f"{label}, {where}: adaptive / " + ", / ".join(parts))
    return lines


def table(rows: list[Row]) -> str:
    """Rows as text; "same" says whether the greedy tokens equalled the target's own."""
    head = (
        f"{'engine':18} {'isl':>6} {'osl':>6} {'dm':>4} {'decode t/s':>11} {'(min-max)':>15} "
        f"{'prefill t/s':>11} {'ttft ms':>8} {'itl ms':>7} {'accept':>6} {'tau':>5} {'speedup':>7} {'roof':>5} "
        f"{'rss MiB':>8} {'same':>4}"
    )
    lines = [head, "-" * len(head)]

    def f(x: float | None, fmt: str) -> str:
        return format(x, fmt) if x is not None else "-"

    for r in rows:
        lines.append(
            f"{r['engine']:18} {r['isl']:6d} {r['osl']:6d} {_dm(r):>4} "
            f"{r['decode_tok_s']:11.1f} {r['decode_tok_s_min']:7.1f}-{r['decode_tok_s_max']:<7.1f} "
            f"{r['prefill_tok_s']:11.1f} {r['ttft_ms']:8.1f} {r['itl_ms']:7.2f} "
            f"{f(r['acceptance_rate'], '6.3f'):>6} {r['tau']:5.2f} {f(r['speedup'], '6.2f'):>6}x "
            f"{f(r['roofline_fraction'], '5.2f'):>5} {r['rss_peak_mib']:8.0f} "
            f"{ {True: 'yes', False: 'NO', None: '-'}[r['same_tokens_as_target']]:>4}"
        )
    return "\n".join(lines)


def _dm(r: Row) -> str:
    """The draft_max column: the pinned length, or the adaptive one's mean ("~2.7")."""
    if r["draft_max"] is not None:
        return str(r["draft_max"])
    return f"~{r['mean_draft_len']:.1f}" if r.get("mean_draft_len") is not None else "auto"


def write_json(path: Path, meta: dict[str, Any], rows: list[Row]) -> None:
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")


def write_csv(path: Path, rows: list[Row]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def _chart(
    path: Path,
    series: dict[str, list[tuple[float, float]]],
    hline: tuple[float, str] | None,
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for label, pts in series.items():
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    if hline is not None:
        ax.axhline(hline[0], color="grey", lw=0.8, ls="--", label=hline[1] or None)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_charts(directory: Path, rows: list[Row], ctx_draft_max: int) -> list[Path]:
    """speedup_vs_context.png, tau_vs_context.png and tok_s_vs_draft_max.png; needs matplotlib."""
    speedup = {
        e: sorted(
            (r["isl"], r["speedup"])
            for r in rows
            if r["engine"] == e and r["draft_max"] == ctx_draft_max and r["speedup"]
        )
        for e in (DFLASH, NATIVE)
    }
    tau = {
        e: sorted(
            (r["isl"], r["tau"]) for r in rows if r["engine"] == e and r["draft_max"] == ctx_draft_max and r["tau"]
        )
        for e in (DFLASH, NATIVE)
    }
    isl0 = min(r["isl"] for r in rows)
    tok_s = {
        e: sorted((r["draft_max"], r["decode_tok_s"]) for r in rows if r["engine"] == e and r["isl"] == isl0)
        for e in (DFLASH, NATIVE)
    }
    base = [r["decode_tok_s"] for r in rows if r["engine"] == TARGET_ONLY and r["isl"] == isl0]
    return [
        _chart(
            directory / "speedup_vs_context.png",
            speedup,
            (1.0, ""),
            "context (ISL = OSL, tokens)",
            "decode speed-up over target-only",
            f"DFlash speed-up vs context (draft_max {ctx_draft_max})",
            log_x=True,
        ),
        _chart(
            directory / "tau_vs_context.png",
            tau,
            None,
            "context (ISL = OSL, tokens)",
            "tau (tokens per target pass)",
            f"DFlash tau vs context (draft_max {ctx_draft_max})",
            log_x=True,
        ),
        _chart(
            directory / "tok_s_vs_draft_max.png",
            tok_s,
            (base[0], "target only") if base else None,
            "draft_max",
            "decode tokens/s",
            f"decode tok/s vs draft_max (ISL = {isl0})",
        ),
    ]


def write_acceptance_chart(path: Path, rates: list[float], title: str) -> Path:
    """A chart of the conditional acceptance of each draft position (position i: the share of
    steps that drafted at least i tokens and kept the first i - 1 which kept the i-th too);
    needs matplotlib."""
    return _chart(
        path,
        {"conditional acceptance": [(float(i + 1), r) for i, r in enumerate(rates)]},
        None,
        "draft position",
        "acceptance",
        title,
    )
