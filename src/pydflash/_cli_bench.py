"""``pydflash bench``: the command line of ``pydflash.bench``."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from .config import FLASH_ATTN


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench.run import ENGINES

    b = sub.add_parser(
        "bench",
        help="benchmark pydflash vs llama.cpp's own DFlash loop vs the target alone",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Measure, in one run with engines alternating run by run: pydflash target-only, pydflash "
            "DFlash, llama.cpp's native DFlash loop (llama-speculative-simple, built from the vendored "
            "tree with tools/build_native.py) and llama-cpp-python (if installed). Greedy, one request at "
            "a time, EOS ignored so every request generates exactly OSL tokens; an ISL = OSL sweep at one "
            "draft_max and a draft_max sweep at the smallest ISL; medians over repeats.",
            100,
        ),
        epilog="examples:\n  pydflash bench --quick --json bench.json\n"
        "  pydflash bench --isl 512,4096,12288,36864 -m target.gguf -d drafter.gguf --json out.json",
    )
    b.add_argument("--quick", action="store_true", help="a small sweep (ISL 64,256; 2 repeats): under 5 minutes")
    b.add_argument("-m", "--model", metavar="TARGET", help="target GGUF (default: the embedded pair)")
    b.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF (with -m)")
    b.add_argument(
        "--pad-ffn",
        type=int,
        default=None,
        metavar="N",
        help="benchmark a memory-bound copy of the target with its FFN zero-padded to N (same outputs;"
        " default: 16384 for the embedded pair, 0 = as is for -m)",
    )
    b.add_argument("--isl", type=_ints, help="input lengths, comma-separated (default: 128,512,2048)")
    b.add_argument("--osl", type=_ints, help="output lengths, one per ISL (default: OSL = ISL)")
    b.add_argument("--draft-max", type=_ints, help="draft_max sweep (default: 1,2,4,8,12,15 as the block allows)")
    b.add_argument("--ctx-draft-max", type=int, help="draft_max of the context sweep (default: block size - 1)")
    b.add_argument("--repeats", type=int, help="timed runs per configuration (default: 3; --quick: 2)")
    b.add_argument("--warmup", type=int, default=1, help="warm-up runs per engine (default: %(default)s)")
    b.add_argument(
        "--engines",
        type=lambda t: tuple(x for x in t.split(",") if x),
        help=f"comma-separated subset of {','.join(ENGINES)}",
    )
    b.add_argument(
        "--native", metavar="PATH", help="llama-speculative-simple binary (default: build/native/bin/ here, then PATH)"
    )
    b.add_argument("--threads", type=int, default=0, help="CPU threads for every engine (default: all cores)")
    b.add_argument("--no-bandwidth", action="store_true", help="skip the memory-bandwidth measurement")
    b.add_argument(
        "-fa",
        "--flash-attn",
        choices=FLASH_ATTN,
        help="flash attention in every engine alike (default: auto, llama.cpp's default, which is "
        "on for the CPU; llama-cpp-python takes a bool: on unless off)",
    )
    b.add_argument("--json", type=Path, metavar="PATH", help="write rows + metadata as JSON")
    b.add_argument("--csv", type=Path, metavar="PATH", help="write rows as CSV")
    b.add_argument("--charts", type=Path, metavar="DIR", help="write PNG charts here (needs matplotlib)")


def run(a: argparse.Namespace) -> int:
    from .bench import BenchConfig, report, run

    if (a.model is None) != (a.draft is None):
        raise ValueError("give both -m TARGET and -d DRAFT, or neither (the embedded pair)")
    changes = {
        k: v
        for k, v in dict(
            target=a.model,
            draft=a.draft,
            pad_ffn=a.pad_ffn,
            isl=a.isl,
            osl=a.osl,
            draft_max=a.draft_max,
            ctx_draft_max=a.ctx_draft_max,
            repeats=a.repeats,
            warmup=a.warmup,
            engines=a.engines,
            native=a.native,
            threads=a.threads,
            flash_attn=a.flash_attn,
        ).items()
        if v is not None
    }
    changes["bandwidth"] = not a.no_bandwidth
    cfg = BenchConfig.quick(**changes) if a.quick else BenchConfig(**changes)
    res = run(cfg)
    print()
    print(report.table(res["rows"]))
    print()
    for line in res["goals"]:
        print(line)
    for name, why in res["meta"]["skipped"].items():
        print(f"not measured: {name} ({why})")
    if a.json:
        report.write_json(a.json, res["meta"] | {"goals": res["goals"]}, res["rows"])
        print(f"wrote {a.json}")
    if a.csv:
        report.write_csv(a.csv, res["rows"])
        print(f"wrote {a.csv}")
    if a.charts:
        a.charts.mkdir(parents=True, exist_ok=True)
        try:
            for p in report.write_charts(a.charts, res["rows"], res["meta"]["ctx_draft_max"]):
                print(f"wrote {p}")
        except ImportError:
            print("charts skipped: matplotlib is not installed (pip install matplotlib)")
    return 0
