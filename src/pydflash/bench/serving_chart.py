"""The serving sweep's chart: aggregate output tok/s against concurrency, one
line per engine, one panel per result (e.g. the padded pair and the shipped
pair); needs matplotlib (the ``bench`` extra).

    python -m pydflash.bench.serving_chart padded.json shipped.json -o sweep.png
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .servers import ENGINES

Panel = tuple[str, Sequence[dict[str, Any]]]  # (title, the result's rows)


def series(rows: Sequence[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{engine: [(concurrency, aggregate tok/s), ...]} of the sweep's rows, in ENGINES' order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for e in ENGINES:
        points = sorted(
            (r["concurrency"], r["output_tok_s"]) for r in rows if r["workload"] == "concurrency" and r["engine"] == e
        )
        if points:
            out[e] = points
    return out


def write_chart(path: Path, panels: Sequence[Panel]) -> Path:
    """One panel per (title, rows), side by side; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("no results to chart")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels, strict=True):
        lines = series(rows)
        if not lines:
            raise ValueError(f"{title}: no concurrency sweep in these rows")
        for engine, points in lines.items():
            ax.plot([c for c, _ in points], [t for _, t in points], marker="o", label=engine)
        levels = sorted({c for points in lines.values() for c, _ in points})
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("aggregate output tok/s")
        ax.set_title(textwrap.fill(title, 56), fontsize=9)  # a target's description is long
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def panel_of(result_json: Path) -> Panel:
    """A result file of ``pydflash bench --serving --json``: its target as the title, its rows."""
    data = json.loads(result_json.read_text())
    target = data["meta"].get("models", {}).get("target", result_json.stem)
    return str(target), data["rows"]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="chart serving sweeps: one panel per result JSON")
    ap.add_argument("results", nargs="+", type=Path, help="pydflash bench --serving --json files")
    ap.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    a = ap.parse_args(argv)
    print(f"wrote {write_chart(a.output, [panel_of(p) for p in a.results])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
