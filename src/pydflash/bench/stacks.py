"""`pydflash bench --workloads`: drafting configurations side by side on the
three workloads of tasks.py (code completion, copy-heavy edits, prose):
pydflash with the target alone, DFlash, and n-gram + DFlash stacks (llama.cpp's
--spec-type lists), next to llama.cpp's own loop with the same lists. Greedy,
one stream, EOS ignored, engines alternating run by run; medians."""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .engines import Engine, EngineUnavailable, Measurement, NativeEngine, WorkerEngine, find_native
from .run import NO_DRAFTER, Log, check_models, machine_info, prepare_models, round_up
from .tasks import WORKLOADS, prompts
from .workload import text_codec

TARGET = "pydflash target"
ADAPTIVE = "pydflash draft-dflash adaptive"  # draft_max None: the adaptive length; the others pin it
STACKS = ("ngram-mod,draft-dflash", "ngram-map-k,draft-dflash", "ngram-simple,draft-dflash")


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    target: str | None = None  # None: the embedded pair (padded: memory-bound)
    draft: str | None = None
    pad_ffn: int | None = None
    workloads: tuple[str, ...] = WORKLOADS
    isl: int = 256
    osl: int = 256
    prompts: int = 3
    repeats: int = 1
    stacks: tuple[str, ...] = STACKS
    draft_max: int | None = None  # None: block size - 1
    native: str | None = None
    threads: int = 0
    flash_attn: str = "auto"

    def validate(self) -> None:
        unknown = set(self.workloads) - set(WORKLOADS)
        if unknown:
            raise ValueError(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
        if self.prompts < 1 or self.repeats < 1 or self.isl < 16 or self.osl < 1:
            raise ValueError("prompts and repeats must be >= 1, isl >= 16, osl >= 1")
        check_models(self.target, self.draft)


def run(cfg: WorkloadConfig, log: Log = print) -> dict[str, Any]:
    """{"meta", "rows", "ratios"}: one row per (workload, engine)."""
    cfg.validate()
    threads = cfg.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="pydflash-bench-") as td:
        target, draft, source = prepare_models(cfg.target, cfg.draft, cfg.pad_ffn, Path(td), log)
        n_ctx = round_up(cfg.isl * 2 + cfg.osl + 64, 256)
        engines, skipped = _start(cfg, target, draft, n_ctx, threads, log)
        # no drafter: 0, and the n-gram stacks draft their own lengths
        dm = cfg.draft_max or next((e.info["max_draft"] for e in engines if e.name == "pydflash draft-dflash"), 0)
        try:
            work = _prompts(source["tokenizer_model"], cfg)
            ms = _measure(engines, work, cfg, dm, log)
        finally:
            for e in engines:
                e.close()
    rows = aggregate(ms)
    meta = {
        "command_config": dataclasses.asdict(cfg),
        "models": {"target": source["target_desc"], "draft": source["draft_desc"]},
        "draft_max": dm,
        "n_ctx": n_ctx,
        "threads": threads,
        "machine": machine_info(),
        "engines": {e.name: {k: v for k, v in e.info.items() if k != "memory"} for e in engines},
        "skipped": skipped,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    return {"meta": meta, "rows": rows, "ratios": ratios(rows)}


def _start(
    cfg: WorkloadConfig, target: str, draft: str | None, n_ctx: int, threads: int, log: Log
) -> tuple[list[Engine], dict[str, str]]:
    fa = cfg.flash_attn
    engines: list[Engine] = [WorkerEngine(TARGET, "pydflash", target, None, n_ctx, threads, n_ctx, fa)]
    skipped: dict[str, str] = {}
    if draft is not None:
        engines += [
            WorkerEngine("pydflash draft-dflash", "pydflash", target, draft, n_ctx, threads, n_ctx, fa),
            WorkerEngine(ADAPTIVE, "pydflash", target, draft, n_ctx, threads, n_ctx, fa),
        ]
    else:
        skipped |= {"pydflash draft-dflash": NO_DRAFTER, ADAPTIVE: NO_DRAFTER}
    stacks = [s for s in (_stack(s, draft) for s in cfg.stacks) if s]
    engines += [
        WorkerEngine(f"pydflash {s}", "pydflash", target, _draft(s, draft), n_ctx, threads, n_ctx, fa, spec_type=s)
        for s in stacks
    ]
    exe = find_native(cfg.native)
    for s in (["draft-dflash"] if draft is not None else []) + stacks:
        try:
            d = _draft(s, draft)
            engines.append(NativeEngine(exe, target, d, n_ctx, threads, fa, spec_type=s, name=f"llama.cpp {s}"))
        except EngineUnavailable as ex:
            skipped[f"llama.cpp {s}"] = str(ex)
            log(f"skipping llama.cpp {s}: {ex}")
    return engines, skipped


def _stack(spec_type: str, draft: str | None) -> str:
    """The stack as it runs: without a drafter, its n-gram types alone ("" where none is left)."""
    if draft is not None:
        return spec_type
    return ",".join(t for t in spec_type.split(",") if t != "draft-dflash")


def _draft(spec_type: str, draft: str | None) -> str | None:
    """A draft-mtp stack drafts with the target's own MTP head: no drafter file."""
    return None if "draft-mtp" in spec_type.split(",") else draft


def _prompts(tokenizer_model: str, cfg: WorkloadConfig) -> dict[str, list[str]]:
    from ..llama import Llama

    with Llama(tokenizer_model, n_ctx=64) as tok:
        return {w: prompts(w, *text_codec(tok), cfg.isl, cfg.prompts) for w in cfg.workloads}


def _measure(
    engines: list[Engine], work: dict[str, list[str]], cfg: WorkloadConfig, dm: int, log: Log
) -> list[Measurement]:
    first = next(iter(work.values()))[0]
    for e in engines:  # warm-up: caches, page faults, thread pools
        e.run(first, 16, dm)
    out: list[Measurement] = []
    k = 0
    for r in range(cfg.repeats):
        for w, texts in work.items():
            for i, text in enumerate(texts):
                k += 1
                turn = engines[k % len(engines) :] + engines[: k % len(engines)]  # rotate the order
                for e in turn:
                    m = e.run(text, cfg.osl, None if e.name == ADAPTIVE else dm if e.uses_draft else 0)
                    m.update(engine=e.name, workload=w, prompt=i, repeat=r)
                    out.append(m)
                    log(
                        f"{w:6} p{i} r{r} {e.name:34} {m['n_generated'] / max(m['decode_s'], 1e-9):8.1f} tok/s "
                        f"tau {m['n_generated'] / max(m['n_steps'], 1):5.2f}"
                    )
    # greedy outputs equal the target's own, prompt by prompt (pydflash engines expose tokens)
    ref = {(m["workload"], m["prompt"], m["repeat"]): m["tokens_head"] for m in out if m["engine"] == TARGET}
    for m in out:
        if "tokens_head" in m and m["engine"] != TARGET:
            m["same_tokens_as_target"] = m["tokens_head"] == ref[(m["workload"], m["prompt"], m["repeat"])]
    return out


def aggregate(ms: list[Measurement]) -> list[dict[str, Any]]:
    """Medians per (workload, engine); speed-up against the target alone, per prompt then median."""
    base = {(m["workload"], m["prompt"], m["repeat"]): _tps(m) for m in ms if m["engine"] == TARGET}
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for m in ms:
        groups.setdefault((m["workload"], m["engine"]), []).append(m)
    rows = []
    for (w, e), g in groups.items():
        drafted, accepted = sum(m["n_drafted"] for m in g), sum(m["n_accepted"] for m in g)
        same = [m["same_tokens_as_target"] for m in g if "same_tokens_as_target" in m]
        rows.append({
            "workload": w,
            "engine": e,
            "runs": len(g),
            "decode_tok_s": statistics.median(_tps(m) for m in g),
            "speedup": statistics.median(_tps(m) / base[(w, m["prompt"], m["repeat"])] for m in g),
            "tau": sum(m["n_generated"] for m in g) / max(sum(m["n_steps"] for m in g), 1),
            "acceptance": accepted / drafted if drafted else 0.0,
            "n_drafted": drafted,
            "n_accepted": accepted,
            "outputs_identical": all(same) if same else None,
        })  # fmt: skip
    return rows


def _tps(m: Measurement) -> float:
    return float(m["n_generated"]) / max(float(m["decode_s"]), 1e-9)


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per workload: pydflash's best stack against llama.cpp's best stack, and each
    configuration against the same one in llama.cpp (decode tok/s medians)."""
    out: dict[str, dict[str, Any]] = {}
    for w in dict.fromkeys(r["workload"] for r in rows):
        by = {r["engine"]: r["decode_tok_s"] for r in rows if r["workload"] == w}
        ours = {e[len("pydflash ") :]: v for e, v in by.items() if e.startswith("pydflash ") and "ngram" in e}
        if ADAPTIVE in by:
            entry_adaptive = {"adaptive / fixed": by[ADAPTIVE] / by["pydflash draft-dflash"],
                              "adaptive / target": by[ADAPTIVE] / by[TARGET]}  # fmt: skip
        native = {e[len("llama.cpp ") :]: v for e, v in by.items() if e.startswith("llama.cpp ") and "ngram" in e}
        entry: dict[str, Any] = {
            "same_config": {s: ours[s] / native[s] for s in ours if s in native},
        }
        if ADAPTIVE in by:
            entry["adaptive"] = entry_adaptive
        if "draft-dflash" in {e[len("llama.cpp ") :] for e in by if e.startswith("llama.cpp ")}:
            entry["same_config"]["draft-dflash"] = by["pydflash draft-dflash"] / by["llama.cpp draft-dflash"]
        if ours and native:
            best_o, best_n = max(ours, key=ours.__getitem__), max(native, key=native.__getitem__)
            entry["best_stack"] = {"pydflash": best_o, "llama.cpp": best_n, "ratio": ours[best_o] / native[best_n]}
        out[w] = entry
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'workload':8} {'engine':36} {'tok/s':>8} {'speed-up':>8} {'tau':>6} {'accept':>7} {'same':>5}"]
    for r in rows:
        same = {None: "-", True: "yes", False: "NO"}[r["outputs_identical"]]
        lines.append(
            f"{r['workload']:8} {r['engine']:36} {r['decode_tok_s']:8.1f} {r['speedup']:7.2f}x "
            f"{r['tau']:6.2f} {r['acceptance']:7.3f} {same:>5}"
        )
    return "\n".join(lines)


def ratio_lines(res: dict[str, Any]) -> list[str]:
    out = []
    for w, e in res["ratios"].items():
        same = ", ".join(f"{s} {v:.2f}x" for s, v in e["same_config"].items())
        out.append(f"{w}: pydflash / llama.cpp, same configuration: {same}")
        if "adaptive" in e:
            out.append(f"{w}: adaptive draft length / fixed block - 1: {e['adaptive']['adaptive / fixed']:.2f}x, "
                       f"/ target alone: {e['adaptive']['adaptive / target']:.2f}x")  # fmt: skip
        if "best_stack" in e:
            b = e["best_stack"]
            out.append(f"{w}: best stack, pydflash ({b['pydflash']}) / llama.cpp ({b['llama.cpp']}): {b['ratio']:.2f}x")
    return out
