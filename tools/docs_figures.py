"""The docs site's pictures, made by the project's own code (run from the repository root):

    python tools/docs_figures.py

- docs/img/step.svg: one speculative step (draft block -> verify -> accept -> roll back), drawn
  from a real step of the embedded pair (its drafted, kept and rejected tokens);
- docs/img/bench/speedup_vs_context.png, tau_vs_context.png, tok_s_vs_draft_max.png: the bench's
  own charts (pydflash.bench.report.write_charts) drawn from the committed bench results
  benchmarks/results/long-context-cpu-2core.json and cpu-2core.json (no bench run);
- docs/img/bench/serving_sweep.png: aggregate tok/s against concurrent streams, drawn by
  pydflash.bench.serving_chart from benchmarks/results/serving-sweep-{padded,shipped}-cpu-2core.json;
- docs/img/bench/acceptance_per_position.png and
  benchmarks/results/acceptance-per-position-embedded.json: the conditional acceptance of each
  draft position, measured in-process on the embedded pair (draft_max 7, greedy; seconds);
- docs/img/webui.png: the chat page after one streamed reply of the embedded pair, served on
  127.0.0.1 and shot in headless Chromium, as its browser test does (tools/webui_browser.py);
- docs/img/train_curve.png: online tau against training minutes of `pydflash train-drafter` runs,
  drawn from their committed reports benchmarks/results/train-*.json (no training run).

Needs matplotlib (pip install ".[bench]"), the server extra and a Chromium (apt-get install
chromium) for the page; `--only webui` makes that one alone.
"""

from __future__ import annotations

import argparse
import html
import json
import shutil
import sys
import tempfile
from pathlib import Path

from pydflash import Llama, embedded_pair
from pydflash.bench import report, serving_chart

sys.path.insert(0, str(Path(__file__).resolve().parent))
import webui_browser  # (beside this file)

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"
RESULTS = ROOT / "benchmarks" / "results"

# held-out style prompts (the embedded pair writes Python)
PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n",
    "class Stack:\n    def __init__(self):\n",
    "    for i in range(len(items)):\n",
    "def read_config(path):\n    with open(path) as f:\n",
    "class Point:\n    def __init__(self, x, y):\n",
)
DRAFT_MAX = 7
MAX_TOKENS = 96


def _piece(llm: Llama, token: int) -> str:
    return llm.detokenize([token]).replace("\n", "\\n").replace(" ", "\u00b7")


def step_svg(path: Path) -> None:
    """One real step of the embedded pair, drawn as boxes: the block the drafter fills, the
    target's verification, the kept prefix plus the target's own token, the rejected rest."""
    target, drafter = embedded_pair()
    with Llama(target, draft=drafter) as llm:
        pair = llm.pair
        pair.prefill(llm.tokenize("class Stack:\n    def __init__(self):\n        self.items = []\n\n"))
        best = None  # the partly kept step that kept most: it shows every part of a step
        for _ in range(24):
            last = pair.tokens[-1]
            step = pair.step(draft_max=DRAFT_MAX)
            if 0 < step.n_accepted < step.n_drafted and (best is None or step.n_accepted > best[1].n_accepted):
                best = (last, step)
        assert best is not None, "no step of the embedded pair kept part of its draft"
        last_token, step = best
        drafted = [_piece(llm, t) for t in step.drafted]
        kept = step.n_accepted
        own = _piece(llm, step.tokens[-1])
        last = _piece(llm, last_token)
    w, box, x0 = 84, 76, 170
    rows: list[str] = []

    def text(x: float, y: float, s: str, size: int = 13, anchor: str = "start", weight: str = "normal") -> None:
        rows.append(
            f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
            f"{html.escape(s)}</text>"
        )

    def cell(i: int, y: float, label: str, fill: str) -> None:
        x = x0 + i * w
        rows.append(f'<rect x="{x}" y="{y}" width="{box}" height="30" rx="4" fill="{fill}" stroke="#555"/>')
        text(x + box / 2, y + 20, label[:9], 12, "middle")

    n = len(drafted)
    text(10, 36, "1. draft", 14, weight="bold")
    text(10, 54, "one drafter pass", 11)
    cell(0, 20, last, "#e8e8e8")
    for i in range(n):
        cell(i + 1, 20, "MASK", "#f4f4f4")
    text(10, 106, "  drafter fills", 11)
    cell(0, 90, last, "#e8e8e8")
    for i, d in enumerate(drafted):
        cell(i + 1, 90, d, "#dbe9f6")
    text(10, 176, "2. verify", 14, weight="bold")
    text(10, 194, "one target pass", 11)
    for i in range(n + 1):
        cell(i, 160, f"row {i}", "#fff6d5")
    text(10, 246, "3. accept", 14, weight="bold")
    text(10, 264, "kept + own token", 11)
    for i in range(kept):
        cell(i + 1, 230, drafted[i], "#cdebc5")
    cell(kept + 1, 230, own, "#9fd68f")
    text(10, 316, "4. roll back", 14, weight="bold")
    text(10, 334, "rejected drafts", 11)
    for i in range(kept, n):
        cell(i + 1, 300, drafted[i], "#f3c4c4")
    width = x0 + (n + 1) * w + 10
    note = (
        f"embedded pair, draft_max {n}: {kept} of {n} drafts kept, then the target's own token; "
        "the rejected drafts leave the target's KV cache"
    )
    text(10, 372, note, 11)
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="386" '
        f'font-family="DejaVu Sans Mono, monospace">\n<rect width="100%" height="100%" fill="white"/>\n'
        + "\n".join(rows)
        + "\n</svg>\n"
    )
    path.write_text(svg)


def bench_charts(out: Path) -> list[Path]:
    """The bench's charts from committed results: speed-up and tau against context (pair v2,
    long-context run) and tok/s against draft_max (the cpu-2core run)."""
    made = []
    with tempfile.TemporaryDirectory() as td:
        for src, names in (
            ("long-context-cpu-2core.json", ("speedup_vs_context.png", "tau_vs_context.png")),
            ("cpu-2core.json", ("tok_s_vs_draft_max.png",)),
        ):
            res = json.loads((RESULTS / src).read_text())
            d = Path(td) / src
            d.mkdir()
            report.write_charts(d, res["rows"], res["meta"]["ctx_draft_max"])
            for name in names:
                shutil.copyfile(d / name, out / name)
                made.append(out / name)
    return made


def acceptance_per_position(out: Path) -> Path:
    """Conditional acceptance per draft position, in-process on the embedded pair."""
    target, drafter = embedded_pair()
    reached = [0] * DRAFT_MAX
    kept = [0] * DRAFT_MAX
    with Llama(target, draft=drafter, draft_max=DRAFT_MAX) as llm:
        for p in PROMPTS:
            res = llm.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True)
            for st in res.stats.steps:
                for i in range(min(st.n_drafted, st.n_accepted + 1)):
                    reached[i] += 1
                    kept[i] += i < st.n_accepted
    rates = [k / r if r else 0.0 for k, r in zip(kept, reached, strict=True)]
    record = {
        "command": "python tools/docs_figures.py",
        "model": "embedded pair (pydflash.embedded_pair()), unpadded",
        "draft_max": DRAFT_MAX,
        "max_tokens": MAX_TOKENS,
        "prompts": list(PROMPTS),
        "steps_reaching_position": reached,
        "kept_at_position": kept,
        "conditional_acceptance": [round(r, 4) for r in rates],
    }
    (RESULTS / "acceptance-per-position-embedded.json").write_text(json.dumps(record, indent=2) + "\n")
    return report.write_acceptance_chart(
        out / "acceptance_per_position.png", rates, f"embedded pair: acceptance per position (draft_max {DRAFT_MAX})"
    )


def webui_shot(path: Path) -> Path | None:
    """The chat page after one reply of the embedded pair (None, said why, without a Chromium)."""
    from pydflash.server import Server

    chromium = webui_browser.find_chromium()
    if chromium is None:
        print(f"skipped {path}: no Chromium (apt-get install chromium)", file=sys.stderr)
        return None
    target, drafter = embedded_pair()
    with Llama(target, draft=drafter, n_ctx=2048) as llm, Server(llm, port=0) as srv:
        return webui_browser.chat_screenshot(srv.url, path, chromium)


def train_curve(path: Path) -> Path:
    """Online tau (draft_max 7, held-out prompts) against training minutes, one line per report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for f in sorted(RESULTS.glob("train-*.json")):
        d = json.loads(f.read_text())
        rep = d["report"]
        xs = [p["minutes"] for p in rep["curve"]]
        ys = [p["tau"] for p in rep["curve"]]
        ax.plot(xs, ys, marker="o", label=d.get("label", f.stem))
    ax.set_xlabel("training minutes (the run's data and measurements not counted)")
    ax.set_ylabel(f"tau at draft_max {DRAFT_MAX}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("webui", "train"), help="make that figure alone")
    a = ap.parse_args(argv)
    if a.only == "webui":
        print(webui_shot(IMG / "webui.png"))
        return 0
    if a.only == "train":
        print(train_curve(IMG / "train_curve.png"))
        return 0
    (IMG / "bench").mkdir(parents=True, exist_ok=True)
    step_svg(IMG / "step.svg")
    print(IMG / "step.svg")
    for p in bench_charts(IMG / "bench"):
        print(p)
    sweeps = [RESULTS / f"serving-sweep-{pair}-cpu-2core.json" for pair in ("padded", "shipped")]
    print(serving_chart.write_chart(IMG / "bench" / "serving_sweep.png", [serving_chart.panel_of(p) for p in sweeps]))
    print(acceptance_per_position(IMG / "bench"))
    print(train_curve(IMG / "train_curve.png"))
    print(webui_shot(IMG / "webui.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
