"""The benchmark run: engines side by side, alternating run by run, with
the published DFlash methodology (greedy, concurrency 1, fixed seed, EOS
ignored so every request generates exactly OSL tokens, ISL = OSL sweep, a
draft_max sweep, warm-up, repeats, medians)."""

from __future__ import annotations

import dataclasses
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config import FLASH_ATTN
from . import report
from .engines import Engine, EngineUnavailable, Measurement, NativeEngine, WorkerEngine, find_native
from .roofline import bytes_per_pass, measure_bandwidth
from .tasks import WORKLOADS
from .tasks import prompts as workload_prompts
from .workload import text_codec

ENGINES = (report.TARGET_ONLY, report.DFLASH, report.ADAPTIVE, report.NATIVE, report.LCP)
DRAFT_MAX_SWEEP = (1, 2, 4, 8, 12, 15)
REWARM_TOKENS = 4  # the untimed run before each timed one of a persistent engine (with --warmup)
Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One ``pydflash bench`` run: the models, the lengths, the engines and the repeats (the
    command line's flags, as fields)."""

    target: str | None = None  # None: the embedded trained pair
    draft: str | None = None
    pad_ffn: int | None = None  # FFN width of a memory-bound copy of the target (0: as is;
    # None: 16384 for the embedded pair, 0 for given models)
    isl: tuple[int, ...] = (128, 512, 2048)
    osl: tuple[int, ...] | None = None  # None: OSL = ISL
    draft_max: tuple[int, ...] | None = None  # None: DRAFT_MAX_SWEEP as the block allows
    ctx_draft_max: int | None = None  # draft_max of the context sweep (None: block_size - 1)
    # the pydflash engines' drafter window (None: pydflash's default; 0: the whole context,
    # as llama-speculative-simple's drafter sees it)
    draft_window: int | None = None
    repeats: int = 3
    warmup: int = 1
    engines: tuple[str, ...] = ENGINES
    native: str | None = None  # llama-speculative-simple (None: look for it)
    threads: int = 0  # 0: all cores
    bandwidth: bool = True  # measure memory bandwidth for the roofline
    flash_attn: str = "auto"  # every engine alike: "auto" (llama.cpp's default; enabled
    # on the CPU), "on" or "off" (llama-cpp-python: on unless "off")
    # the prompts: held-out stdlib "code", copy-heavy "edit" (a function asked for again,
    # about ISL tokens) or "prose" (tasks.WORKLOADS)
    workload: str = "code"

    @staticmethod
    def quick(**changes: Any) -> BenchConfig:
        """Under 5 minutes on 2 cores."""
        return dataclasses.replace(BenchConfig(isl=(64, 256), repeats=2), **changes)

    def validate(self) -> None:
        """Check the configuration before anything runs.

        Raises:
            ValueError: A value is out of range or the lists do not match (the message says which).
        """
        if not self.isl or min(self.isl) < 2:
            raise ValueError("isl: give context lengths >= 2")
        if self.osl is not None and len(self.osl) != len(self.isl):
            raise ValueError("osl: give one per isl (or none for OSL = ISL)")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        if self.ctx_draft_max is not None and self.ctx_draft_max < 0:
            raise ValueError("ctx_draft_max must be >= 0 (0: the pair without drafts)")
        if self.draft_window is not None and self.draft_window < 0:
            raise ValueError("draft_window must be >= 0 (0: the whole context)")
        unknown = set(self.engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"unknown engines {sorted(unknown)}; choose from {list(ENGINES)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {sorted(WORKLOADS)}, not {self.workload!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be auto, on or off, not {self.flash_attn!r}")
        check_models(self.target, self.draft)


def check_models(target: str | None, draft: str | None) -> None:
    """A drafter needs its target; a target alone is measured alone (and with n-gram drafts)."""
    if draft is not None and target is None:
        raise ValueError("a drafter (-d) needs its target (-m); give neither for the embedded pair")


def run(cfg: BenchConfig, log: Log = print) -> dict[str, Any]:
    """Run the benchmark; returns {"meta", "rows", "goals", "skipped"}."""
    cfg.validate()
    threads = cfg.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="pydflash-bench-") as td:
        target, draft, source = prepare_models(cfg.target, cfg.draft, cfg.pad_ffn, Path(td), log)
        osls = cfg.osl or cfg.isl
        n_ctx = round_up(max(i + o for i, o in zip(cfg.isl, osls, strict=True)) + 64, 256)
        engines, skipped = _start(cfg, target, draft, n_ctx, threads, log)
        try:
            max_draft = next((e.info["max_draft"] for e in engines if e.uses_draft and "max_draft" in e.info), None)
            if max_draft is None and draft is None:
                max_draft = 0  # no drafter: the target-only engines alone
            elif max_draft is None:
                from ..llama import Llama

                with Llama(target, draft=draft, n_ctx=256) as probe:
                    max_draft = probe.pair.max_draft
            ctx_dm = max_draft if cfg.ctx_draft_max is None else cfg.ctx_draft_max  # 0: the pair decoding plainly
            sweep = sorted({d for d in (cfg.draft_max or DRAFT_MAX_SWEEP) if d <= max_draft} | {ctx_dm})
            if not any(_sweeps(e) for e in engines):
                sweep = []  # only target-only engines: nothing to sweep
            plan = _plan(cfg.isl, osls, ctx_dm, sweep)
            prompts = _prompts(source, cfg, max(cfg.repeats, 1))
            measurements = _measure(engines, plan, prompts, cfg, log)
        finally:
            for e in engines:
                e.close()
        roofline: dict[str, Any] | None = None
        if cfg.bandwidth:
            roofline = _roofline(engines, cfg, osls, n_ctx, threads, log)
        rows = report.aggregate(measurements, roofline)
        meta = {
            "command_config": dataclasses.asdict(cfg),
            "models": {"target": source["target_desc"], "draft": source["draft_desc"]},
            "n_ctx": n_ctx,
            "threads": threads,
            "machine": machine_info(),
            "ctx_draft_max": ctx_dm,
            "draft_max_sweep": sweep,
            "roofline": roofline,
            "engines": {e.name: e.info for e in engines},
            "skipped": skipped,
            "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        }
        meta["adaptive_ratios"] = report.adaptive_ratios(rows)
        return {"meta": meta, "rows": rows, "goals": report.goals(rows)}


def round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def prepare_models(
    given_target: str | None, given_draft: str | None, pad_ffn: int | None, workdir: Path, log: Log
) -> tuple[str, str | None, dict[str, str]]:
    """(target, drafter, source): the given pair (or target alone: no drafter) or the
    embedded one, the target replaced by its FFN-padded copy in ``workdir`` when
    ``pad_ffn`` asks (None: 16384 for the embedded pair, as is for a given one)."""
    from ..embedded import embedded_pair

    d: str | None
    if given_target is None:
        t, d = embedded_pair()
        desc = "embedded pair (stdlib-code qwen3 target + DFlash drafter)"
    else:
        t, d = given_target, given_draft
        desc = str(t)
    target = str(t)
    pad = pad_ffn if pad_ffn is not None else (16384 if given_target is None else 0)
    if pad:
        from ..gguf_writers.padding import pad_ffn as write_padded

        target = str(write_padded(t, workdir / "target-padded.gguf", pad))
        desc += f", FFN zero-padded to {pad} (memory-bound copy, identical outputs)"
        log(f"target: {desc} ({Path(target).stat().st_size / 2**20:.0f} MiB)")
    draft_desc = str(d) if d is not None else "none (the target alone, and n-gram drafts)"
    return (
        target,
        None if d is None else str(d),
        {"tokenizer_model": str(t), "target_desc": desc, "draft_desc": draft_desc},
    )


NO_DRAFTER = "no drafter: give -d DRAFT"


def _start(
    cfg: BenchConfig, target: str, draft: str | None, n_ctx: int, threads: int, log: Log
) -> tuple[list[Engine], dict[str, str]]:
    engines: list[Engine] = []
    skipped: dict[str, str] = {}
    for name in cfg.engines:
        e: Engine
        if draft is None and name in (report.DFLASH, report.ADAPTIVE, report.NATIVE):
            skipped[name] = NO_DRAFTER
            continue
        try:
            if name == report.TARGET_ONLY:
                e = WorkerEngine(name, "pydflash", target, None, n_ctx, threads, n_ctx, cfg.flash_attn)
            elif name in (report.DFLASH, report.ADAPTIVE):
                e = WorkerEngine(
                    name,
                    "pydflash",
                    target,
                    draft,
                    n_ctx,
                    threads,
                    n_ctx,
                    cfg.flash_attn,
                    draft_window=cfg.draft_window,
                )
            elif name == report.NATIVE:
                e = NativeEngine(find_native(cfg.native), target, draft, n_ctx, threads, cfg.flash_attn)
            else:
                e = WorkerEngine(name, "llama-cpp-python", target, None, n_ctx, threads, n_ctx, cfg.flash_attn)
            engines.append(e)
        except EngineUnavailable as ex:
            skipped[name] = str(ex)
            log(f"skipping {name}: {ex}")
    if not any(e.name == report.TARGET_ONLY for e in engines):
        raise RuntimeError("the target-only engine is the baseline of every ratio and could not start")
    return engines, skipped


def _plan(
    isls: Sequence[int], osls: Sequence[int], ctx_dm: int, sweep: Sequence[int]
) -> list[tuple[int, int, int, bool]]:
    """(isl, osl, draft_max, with_target_only) configurations in run order."""
    plan = [(i, o, ctx_dm, True) for i, o in zip(isls, osls, strict=True)]
    plan += [(isls[0], osls[0], d, False) for d in sweep if d != ctx_dm]
    return plan


def _sweeps(e: Engine) -> bool:
    """An engine run at every draft_max of the sweep (the adaptive one chooses its own:
    it runs once per workload, beside the target alone)."""
    return e.uses_draft and e.name != report.ADAPTIVE


def _draft_max(e: Engine, dm: int) -> int | None:
    """What an engine is asked to draft: the sweep's value, 0 (target alone) or None (adaptive)."""
    if e.name == report.ADAPTIVE:
        return None
    return dm if e.uses_draft else 0


def _prompts(source: dict[str, str], cfg: BenchConfig, count: int) -> dict[int, list[str]]:
    from ..llama import Llama

    with Llama(source["tokenizer_model"], n_ctx=64) as tok:
        return {isl: workload_prompts(cfg.workload, *text_codec(tok), isl, count) for isl in cfg.isl}


def _measure(
    engines: list[Engine],
    plan: list[tuple[int, int, int, bool]],
    prompts: dict[int, list[str]],
    cfg: BenchConfig,
    log: Log,
) -> list[Measurement]:
    out: list[Measurement] = []
    warm_isl = min(cfg.isl)
    for e in engines:
        for _ in range(cfg.warmup):
            e.run(prompts[warm_isl][0], 16, _draft_max(e, plan[0][2]))
    total = sum(cfg.repeats * len([e for e in engines if _sweeps(e) or with_t]) for *_, with_t in plan)
    done = 0
    for r in range(cfg.repeats):
        for isl, osl, dm, with_target in plan:
            active = [e for e in engines if _sweeps(e) or with_target]
            k = r % len(active)
            for e in active[k:] + active[:k]:  # rotate the order run by run
                if cfg.warmup and e.persistent:
                    # an untimed run first, so every timed run starts warm, as the fixed draft_max
                    # runs (back to back) do: an engine that runs once a round (the target alone,
                    # the adaptive one) would start each run after seconds idle (caches cold)
                    e.run(prompts[warm_isl][0], REWARM_TOKENS, _draft_max(e, dm))
                m = e.run(prompts[isl][r], osl, _draft_max(e, dm))
                m.update(engine=e.name, isl_requested=isl, osl=osl, draft_max=_draft_max(e, dm), repeat=r)
                if "memory" in e.info:
                    m["memory"] = e.info["memory"]
                out.append(m)
                done += 1
                log(
                    f"[{done}/{total}] {e.name:18} isl {isl:5d} osl {osl:5d} dm {m['draft_max']!s:>4}: "
                    f"{m['n_generated'] / max(m['decode_s'], 1e-9):8.1f} tok/s"
                )
    # losslessness inside the bench: greedy tokens equal the target's own on the same prompt
    reference = {
        (m["isl_requested"], m["osl"], m["repeat"]): m["tokens_head"] for m in out if m["engine"] == report.TARGET_ONLY
    }
    for m in out:
        ref = reference.get((m["isl_requested"], m["osl"], m["repeat"]))
        if m["engine"] != report.TARGET_ONLY and m.get("tokens_head") is not None and ref is not None:
            m["same_tokens_as_target"] = m["tokens_head"] == ref
    return out


def _roofline(
    engines: list[Engine], cfg: BenchConfig, osls: Sequence[int], n_ctx: int, threads: int, log: Log
) -> dict[str, Any] | None:
    mem = next((e.info.get("memory") for e in engines if e.name == report.TARGET_ONLY), None)
    if not mem:
        return None
    bw = measure_bandwidth(threads)
    log(f"memory bandwidth (copy, {threads} threads): {bw / 1e9:.1f} GB/s")
    limits: dict[str, dict[str, float]] = {}
    for isl, osl in zip(cfg.isl, osls, strict=True):
        per_pass = bytes_per_pass(mem, n_ctx, isl + osl / 2)
        limits[str(isl)] = {report.TARGET_ONLY: bw / per_pass, report.LCP: bw / per_pass}
    return {
        "bandwidth_bytes_per_s": bw,
        "target_weight_bytes": sum(r["model"] for r in mem["rows"] if r["role"] == "target"),
        "limit_tok_s": limits,
        "note": "limit = copy bandwidth / (target weights + KV cache read per pass); target-only engines",
    }


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info
