"""``pydflash bench``: the command line of ``pydflash.bench``."""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..config import FLASH_ATTN


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..bench.run import ENGINES
    from ..bench.servers import ENGINES as SERVING_ENGINES
    from ..bench.tasks import WORKLOADS

    b = sub.add_parser(
        "bench",
        help="benchmark pydflash vs llama.cpp's own DFlash loop vs the target alone",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Measure, in one run with engines alternating run by run: pydflash target-only, pydflash "
            "DFlash at fixed draft_max values, pydflash DFlash with the adaptive draft length (pydflash-adaptive, "
            "once per ISL, with its ratios to the best and the default fixed draft_max and to the target alone), "
            "llama.cpp's native DFlash loop (llama-speculative-simple, built from the vendored "
            "tree with tools/build_native.py) and llama-cpp-python (if installed). Greedy, one request at "
            "a time, EOS ignored so every request generates exactly OSL tokens; an ISL = OSL sweep at one "
            "draft_max and a draft_max sweep at the smallest ISL; medians over repeats. With --serving: "
            "pydflash serve vs llama-server (built the same way) over HTTP instead (see below).",
            100,
        ),
        epilog="examples:\n  pydflash bench --quick --json bench.json\n"
        "  pydflash bench --isl 512,4096,12288,36864 -m target.gguf -d drafter.gguf --json out.json\n"
        "  pydflash bench --serving --concurrency 1,2,4,8,16 --turns 0 --json serving.json\n"
        "  pydflash bench --serving --concurrency '' --turns 0 --join 4 --json join.json",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="a small sweep (ISL 64,256; 2 repeats): under 5 minutes (--serving: concurrency 1,4, OSL 64, "
        "1 request per stream, history 512, 2 repeats)",
    )
    b.add_argument("-m", "--model", metavar="TARGET", help="target GGUF (default: the embedded pair)")
    b.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF (with -m; none: the target alone)")
    b.add_argument(
        "--pad-ffn",
        type=int,
        default=None,
        metavar="N",
        help="benchmark a memory-bound copy of the target with its FFN zero-padded to N (same outputs;"
        " default: 16384 for the embedded pair, 0 = as is for -m)",
    )
    b.add_argument("--isl", type=_ints, help="input lengths, comma-separated (default: 128,512,2048; --serving: 128)")
    b.add_argument("--osl", type=_ints, help="output lengths, one per ISL (default: OSL = ISL; --serving: 128)")
    b.add_argument(
        "--draft-max",
        type=_ints,
        help="draft_max sweep (default: 1,2,4,8,12,15 as the block allows; --serving: one value, "
        "default block size - 1)",
    )
    b.add_argument("--ctx-draft-max", type=int, help="draft_max of the context sweep (default: block size - 1)")
    b.add_argument("--draft-window", type=int, metavar="N", help="pydflash's drafter window (0: all, as llama.cpp's)")
    b.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        help="prompt text: held-out standard-library code (default), copy-heavy edits (a held-out function "
        "asked for again: about ISL tokens) or the held-out help topics' prose",
    )
    b.add_argument("--repeats", type=int, help="timed runs per configuration (default: 3; --quick: 2)")
    b.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="warm-up runs per engine (default: %(default)s); with any, each timed run of a pydflash engine "
        "follows an untimed 4-token one (0: none)",
    )
    b.add_argument(
        "--engines",
        type=lambda t: tuple(x for x in t.split(",") if x),
        help=f"comma-separated subset of {','.join(ENGINES)} (--serving: of {','.join(SERVING_ENGINES)})",
    )
    b.add_argument(
        "--native", metavar="PATH", help="llama-speculative-simple binary (default: build/native/bin/ here, then PATH)"
    )
    _add_machine_and_outputs(b)
    _add_serving(b)
    _add_workloads(b)


def _add_machine_and_outputs(b: argparse.ArgumentParser) -> None:
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


def _add_workloads(b: argparse.ArgumentParser) -> None:
    from ..bench.stacks import STACKS
    from ..bench.tasks import WORKLOADS

    w = b.add_argument_group(
        "drafting workloads (--workloads)",
        textwrap.fill(
            "Drafting configurations side by side on code completion (held-out code), copy-heavy edits (a "
            "function asked for again) and prose (pydoc topics): pydflash with the target alone, DFlash, and "
            "n-gram + DFlash stacks, next to llama-speculative-simple with the same --spec-type lists. Greedy, "
            "one stream, EOS ignored; medians. -m/-d/--pad-ffn, --isl and --osl (one value each, default 256), "
            "--draft-max (one value, default block size - 1), --repeats (default 1), --threads, -fa, --native "
            "and --json apply.",
            100,
        ),
    )
    w.add_argument(
        "--workloads",
        type=lambda t: tuple(x for x in t.split(",") if x),
        metavar="W,...",
        help=f"run these workloads: comma-separated subset of {','.join(WORKLOADS)}",
    )
    w.add_argument(
        "--stack",
        action="append",
        metavar="TYPES",
        help=f"an n-gram + DFlash --spec-type list to compare (repeatable; default: {' '.join(STACKS)}); "
        "a list with draft-mtp drafts with the target's MTP head (no drafter)",
    )
    w.add_argument("--prompts", type=int, metavar="N", help="prompts per workload (default: 3)")


def _run_workloads(a: argparse.Namespace) -> int:
    from ..bench import report, stacks

    if a.draft_window is not None:
        raise ValueError("--draft-window: not with --workloads (it applies to the ISL sweep)")
    changes: dict[str, Any] = {"workloads": a.workloads}
    for name in ("isl", "osl", "draft_max"):
        values = getattr(a, name)
        if values is not None:
            if len(values) != 1:
                raise ValueError(f"--{name.replace('_', '-')}: give one value with --workloads")
            changes[name] = values[0]
    given = dict(
        target=a.model, draft=a.draft, pad_ffn=a.pad_ffn, repeats=a.repeats, native=a.native, threads=a.threads,
        flash_attn=a.flash_attn, prompts=a.prompts, stacks=tuple(a.stack) if a.stack else None,
    )  # fmt: skip
    changes |= {k: v for k, v in given.items() if v is not None}
    res = stacks.run(stacks.WorkloadConfig(**changes))
    print()
    print(stacks.table(res["rows"]))
    print()
    for line in stacks.ratio_lines(res):
        print(line)
    for name, why in res["meta"]["skipped"].items():
        print(f"not measured: {name} ({why})")
    if a.json:
        meta = res["meta"] | {"command_line": _command_line(a), "ratios": res["ratios"]}
        report.write_json(a.json, meta, res["rows"])
        print(f"wrote {a.json}")
    return 0


def _add_serving(b: argparse.ArgumentParser) -> None:
    s = b.add_argument_group(
        "serving workloads (--serving)",
        textwrap.fill(
            "pydflash serve, llama-server with DFlash and llama-server without speculation (llama-server-plain; "
            "-np slots, -b/-ub 512 each) on 127.0.0.1, driven by one streaming HTTP client (/v1/completions), "
            "engines alternating run by run, greedy, EOS ignored. A concurrency sweep: N streams of requests at "
            "once (prompts of --isl tokens, default 128, cold; --osl tokens each, default 128): aggregate output "
            "tok/s (all streams' tokens over the wall time), time to first token and inter-token latency p50/p99, "
            "tok/s per request, and pydflash's aggregate tok/s over the better llama-server's. A conversation: turn "
            "1 of --history tokens, each later turn resends it all plus --turn-tokens new ones: time to first token "
            "and prompt tokens from the cache. A long prompt joins (--join): N streams decode (--isl-token prompts, "
            "--join-osl tokens), then a --join-prompt-token request joins: the running streams' ITL and delivery "
            "gaps while it prefills, and its time to first token. An ITL value is a delivery's gap over its tokens "
            "(a speculative step's tokens share its time); a gap is the pause between deliveries. With --json "
            "out.json, out.png charts tok/s against concurrency (needs matplotlib). -m/-d/--pad-ffn, --isl, --osl, "
            "--draft-max (one value each), --repeats, --warmup, --threads, -fa, --engines, --json and --quick "
            "apply.",
            100,
        ),
    )
    s.add_argument("--serving", action="store_true", help="run the serving workloads instead")
    s.add_argument(
        "--concurrency",
        type=_ints,
        metavar="N,N,...",
        help="concurrent streams, comma-separated (default: 1,2,4,8,16; '': no sweep)",
    )
    s.add_argument(
        "--join",
        type=int,
        nargs="?",
        const=4,
        metavar="N",
        help="also run the long-prompt-joins workload with N running streams (default N: 4)",
    )
    s.add_argument("--join-prompt", type=int, metavar="N", help="prompt tokens of the joining request (default: 2000)")
    s.add_argument("--join-osl", type=int, metavar="N", help="tokens of each running stream of --join (default: 512)")
    s.add_argument("--requests", type=int, metavar="N", help="requests per stream per run (default: 2)")
    s.add_argument("--turns", type=int, metavar="N", help="turns of the conversation (default: 2; 0: no conversation)")
    s.add_argument(
        "--history", type=int, metavar="N", help="prompt tokens of the conversation's first turn (default: 1500)"
    )
    s.add_argument("--turn-tokens", type=int, metavar="N", help="new prompt tokens of each later turn (default: 100)")
    s.add_argument(
        "--llama-server", metavar="PATH", help="llama-server binary (default: build/native/bin/ here, then PATH)"
    )
    s.add_argument(
        "--log-dir", type=Path, metavar="DIR", help="servers' logs (default: NAME-logs/ beside --json, else a temp dir)"
    )


SERVING_ONLY = (
    "concurrency", "requests", "turns", "history", "turn_tokens", "llama_server", "log_dir", "join", "join_prompt",
    "join_osl",
)  # fmt: skip
NOT_SERVING = ("native", "ctx_draft_max", "csv", "charts", "workload", "draft_window")


def _command_line(a: argparse.Namespace) -> str:
    return shlex.join(["pydflash", *getattr(a, "argv", [])])


def noise_warnings(repeats: int, warmup: int, rows: list[dict[str, Any]]) -> list[str]:
    """Why these figures may be noise rather than a measurement."""
    out = []
    if repeats < 2:
        out.append("one repeat per configuration: no median, one slow run moves the figures (--repeats 3)")
    if warmup < 1:
        out.append("no warm-up: the first runs pay for cold caches and thread start-up (--warmup 1)")
    for r in rows:
        tau, speedup = r.get("tau"), r.get("speedup")
        if tau is not None and speedup is not None and tau < 1.2 and speedup > 1.3:
            # a step yields tau tokens at about one target pass: more than tau-fold is timing, not drafting
            out.append(
                f"{r['engine']} at ISL {r['isl']}, draft_max {r['draft_max']}: speed-up {speedup:.2f}x with tau "
                f"{tau:.2f} (near 1): the baseline's timing is off, not the drafting"
            )
    return out


def run(a: argparse.Namespace) -> int:
    from ..bench import BenchConfig, report, run

    if a.serving and a.workloads:
        raise ValueError("--serving and --workloads are separate runs: give one")
    if a.serving:
        return _run_serving(a)
    if a.workloads:
        return _run_workloads(a)
    if a.stack or a.prompts is not None:
        raise ValueError("--stack, --prompts: only with --workloads")
    given = [f"--{k.replace('_', '-')}" for k in SERVING_ONLY if getattr(a, k) is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --serving")
    if a.charts and importlib.util.find_spec("matplotlib") is None:
        # before the bench, not after minutes of it
        raise ValueError("--charts needs matplotlib: pip install matplotlib (or pydflash[bench])")
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
            draft_window=a.draft_window,
            repeats=a.repeats,
            warmup=a.warmup,
            engines=a.engines,
            native=a.native,
            threads=a.threads,
            flash_attn=a.flash_attn,
            workload=a.workload,
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
    for line in noise_warnings(cfg.repeats, cfg.warmup, res["rows"]):
        print(f"warning: {line}", file=sys.stderr)
    for name, why in res["meta"]["skipped"].items():
        print(f"not measured: {name} ({why})")
    if a.json:
        meta = res["meta"] | {"goals": res["goals"], "command_line": _command_line(a)}
        report.write_json(a.json, meta, res["rows"])
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


def _run_serving(a: argparse.Namespace) -> int:
    from ..bench import join, report, serving, serving_report

    given = [f"--{k.replace('_', '-')}" for k in NOT_SERVING if getattr(a, k) is not None]
    if a.no_bandwidth:
        given.append("--no-bandwidth")
    if given:
        raise ValueError(f"{', '.join(given)}: not with --serving")
    changes: dict[str, Any] = {}
    for name in ("isl", "osl", "draft_max"):
        values = getattr(a, name)
        if values is not None:
            if len(values) != 1:
                raise ValueError(f"--{name.replace('_', '-')}: give one value with --serving")
            changes[name] = values[0]
    log_dir = a.log_dir or (a.json.with_name(a.json.stem + "-logs") if a.json else None)
    given_values = dict(
        target=a.model, draft=a.draft, pad_ffn=a.pad_ffn, concurrency=a.concurrency, requests=a.requests,
        turns=a.turns, history=a.history, turn_tokens=a.turn_tokens, repeats=a.repeats, warmup=a.warmup,
        engines=a.engines, llama_server=a.llama_server, threads=a.threads, flash_attn=a.flash_attn,
        log_dir=None if log_dir is None else str(log_dir), join_streams=a.join, join_prompt=a.join_prompt,
        join_osl=a.join_osl,
    )  # fmt: skip
    changes |= {k: v for k, v in given_values.items() if v is not None}
    cfg = serving.ServingConfig.quick(**changes) if a.quick else serving.ServingConfig(**changes)
    res = serving.run(cfg)
    print()
    print(serving_report.table(res["rows"]))
    joins = join.join_table(res["rows"])
    if joins:
        print()
        print(joins)
    print()
    for line in res["ratio_lines"]:
        print(line)
    for name, why in res["meta"]["skipped"].items():
        print(f"not measured: {name} ({why})")
    print(f"server logs: {res['meta']['log_dir']}")
    if a.json:
        meta = res["meta"] | {"command_line": _command_line(a), "ratios": res["ratios"]}
        report.write_json(a.json, meta, res["rows"])
        print(f"wrote {a.json}")
        _serving_chart(a.json.with_suffix(".png"), meta, res["rows"])
    return 0


def _serving_chart(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    from ..bench import serving_chart

    if not any(r["workload"] == "concurrency" for r in rows):
        return
    if importlib.util.find_spec("matplotlib") is None:
        print("chart skipped: matplotlib is not installed (pip install matplotlib, or pydflash[bench])")
        return
    print(f"wrote {serving_chart.write_chart(path, [(str(meta['models']['target']), rows)])}")
