"""``pydflash bench --serving``: ``pydflash serve`` and llama.cpp's
``llama-server`` with DFlash and without speculation (llama-server-plain)
under serving workloads, all driven over HTTP by the same client
(sse_client.py), on the same model files and prompts, with the engines
alternating run by run:

- a concurrency sweep: N streams at once (1, 2, 4, 8, 16), each sending its
  requests one after another (prompts of ISL tokens, OSL tokens each, greedy,
  EOS ignored, no prompt cache so every prefill is cold), each server started
  with N slots;
- a multi-turn conversation: a first turn of ~1,500 prompt tokens, then turns
  that resend the conversation so far plus ~100 new tokens (prompt cache on):
  time to first token and the prompt tokens taken from the cache (cache_n);
- a long prompt joins (join.py): N streams decode, then a long prompt joins:
  the running streams' inter-token latency while it prefills."""

from __future__ import annotations

import dataclasses
import os
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..config import FLASH_ATTN
from . import join, serving_report
from .engines import find_llama_server
from .run import machine_info, prepare_models, round_up
from .servers import ENGINES, LLAMA_ENGINES, ServerProcess, pydflash_serve_has_parallel, sigterm_unwinds
from .sse_client import TIMEOUT_S, StreamRecord, stream_completion
from .workload import heldout_stdlib_text, make_prompts, text_codec

Log = Callable[[str], None]
CTX_MARGIN = 64  # tokens of context beyond a request's prompt + output


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    target: str | None = None  # None: the embedded trained pair
    draft: str | None = None
    pad_ffn: int | None = None  # as BenchConfig's (None: 16384 for the embedded pair)
    isl: int = 128  # prompt tokens of the concurrency sweep
    osl: int = 128  # tokens generated per request (both workloads)
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)  # (): no sweep
    requests: int = 2  # requests per stream in one run
    turns: int = 2  # turns of the conversation (< 2: no multi-turn workload)
    history: int = 1500  # prompt tokens of the first turn
    turn_tokens: int = 100  # new prompt tokens of each later turn
    join_streams: int = 0  # streams decoding when the long prompt joins (0: no join workload)
    join_prompt: int = 2000  # prompt tokens of the joining request
    join_osl: int = 512  # tokens of each running stream (prompts of isl tokens): they must outlast the join
    join_margin_ms: float = 200.0  # the join window ends this long after the joiner's first token
    repeats: int = 3
    warmup: int = 1  # requests per server before measuring
    engines: tuple[str, ...] = ENGINES
    llama_server: str | None = None  # None: look for it (find_llama_server)
    threads: int = 0  # 0: all cores
    flash_attn: str = "auto"
    # llama-server's --spec-draft-n-max (None: the drafter's block size - 1); given, it also
    # pins pydflash's draft length (None: pydflash chooses each step, up to the same maximum)
    draft_max: int | None = None
    log_dir: str | None = None  # server logs (None: a new temporary directory, kept)

    @staticmethod
    def quick(**changes: Any) -> ServingConfig:
        """A few minutes on 2 cores."""
        base = ServingConfig(osl=64, concurrency=(1, 4), requests=1, history=512, repeats=2)
        return dataclasses.replace(base, **changes)

    def validate(self) -> None:
        if self.isl < 2 or self.osl < 1 or self.history < 2 or self.turn_tokens < 2:
            raise ValueError("isl, history and turn_tokens must be >= 2 and osl >= 1")
        if any(n < 1 for n in self.concurrency) or self.requests < 1:
            raise ValueError("concurrency levels and requests per stream must be >= 1")
        if not self.concurrency and self.turns < 2 and not self.join_streams:
            raise ValueError("nothing to measure: give concurrency levels, turns >= 2 or join streams")
        if self.join_streams < 0 or self.join_prompt < 2 or self.join_osl < 1 or self.join_margin_ms < 0:
            raise ValueError("join streams must be >= 0, the join prompt >= 2 tokens, join OSL >= 1, margin >= 0")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        unknown = set(self.engines) - set(ENGINES)
        if unknown or not self.engines:
            raise ValueError(f"serving engines: a subset of {','.join(ENGINES)}, not {sorted(unknown)}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be auto, on or off, not {self.flash_attn!r}")
        if (self.target is None) != (self.draft is None):
            raise ValueError("give both target and draft, or neither (the embedded pair)")


def run(cfg: ServingConfig, log: Log = print) -> dict[str, Any]:
    """Run the workloads; returns {"meta", "rows", "ratios", "ratio_lines"}."""
    cfg.validate()
    threads = cfg.threads or os.cpu_count() or 1
    log_dir = Path(cfg.log_dir) if cfg.log_dir else Path(tempfile.mkdtemp(prefix="pydflash-bench-serving-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="pydflash-bench-serving-") as td:
        target, draft, source = prepare_models(cfg.target, cfg.draft, cfg.pad_ffn, Path(td), log)
        assert draft is not None  # validate(): both or neither
        settings: dict[str, Any] = dict(
            target=target, draft=draft, threads=threads, flash_attn=cfg.flash_attn,
            draft_max=_max_draft(target, draft) if cfg.draft_max is None else cfg.draft_max,
            pin_draft=cfg.draft_max is not None,
            llama_server=find_llama_server(cfg.llama_server),
        )  # fmt: skip
        engines, skipped = _available(cfg, settings, log)
        prompts = _prompts(source["tokenizer_model"], cfg)
        commands: dict[str, list[str]] = {e: [] for e in engines}
        sweep = _sweep(cfg, settings, engines, prompts["sweep"], log_dir, commands, log)
        turns = _conversations(cfg, settings, engines, prompts, log_dir, commands, log)
        joins = _joins(cfg, settings, engines, prompts, log_dir, commands, log)
    rows = serving_report.sweep_rows(sweep, cfg.isl, cfg.osl) + serving_report.turn_rows(turns, cfg.osl)
    rows += join.join_rows(joins, cfg.join_margin_ms / 1e3)
    same = {e: serving_report.same_outputs(sweep, turns, e) for e in LLAMA_ENGINES}
    ratios = serving_report.ratios(rows, same) + join.join_ratios(rows)
    meta = {
        "mode": "serving",
        "command_config": dataclasses.asdict(cfg),
        "models": {"target": source["target_desc"], "draft": source["draft_desc"]},
        "threads": threads,
        "draft_max": settings["draft_max"],
        "machine": machine_info(),
        "engines": {e: {"commands": commands[e]} for e in engines},
        "llama_server": settings["llama_server"],
        "pydflash_serve_parallel": pydflash_serve_has_parallel(),
        "client": {"timeout_s": TIMEOUT_S, "itl": "a delivery is one speculative step's tokens (llama-server: "
                   "its events with one timings.predicted_ms); k tokens after a gap g count k latencies of g / k",
                   "gap": "the join workload's gap: the time between two deliveries of a stream, whatever their "
                   "tokens (the pause a reader sees)"},
        "skipped": skipped,
        "log_dir": str(log_dir),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }  # fmt: skip
    lines = serving_report.ratio_lines(ratios) + join.join_lines([e for e in ratios if e["workload"] == "join"])
    return {"meta": meta, "rows": rows, "ratios": ratios, "ratio_lines": lines}


def _max_draft(target: str, draft: str) -> int:
    from ..llama import Llama

    with Llama(target, draft=draft, n_ctx=256) as probe:
        return probe.pair.max_draft


def _available(cfg: ServingConfig, settings: dict[str, Any], log: Log) -> tuple[list[str], dict[str, str]]:
    engines, skipped = [], {}
    for e in cfg.engines:
        exe = settings["llama_server"]
        if e in LLAMA_ENGINES and (exe is None or not os.access(exe, os.X_OK)):
            where = f" at {exe}" if exe else ""
            skipped[e] = (
                f"llama-server not found{where} (build it: python tools/build_native.py, or --llama-server PATH)"
            )
            log(f"skipping {e}: {skipped[e]}")
        else:
            engines.append(e)
    return engines, skipped


def _prompts(tokenizer_model: str, cfg: ServingConfig) -> dict[str, list[str]]:
    from ..llama import Llama

    corpus = heldout_stdlib_text()
    out: dict[str, list[str]] = {"sweep": [], "history": [], "turn": [], "join_streams": [], "join": []}
    with Llama(tokenizer_model, n_ctx=64) as tok:
        if cfg.concurrency:
            out["sweep"] = make_prompts(*text_codec(tok), cfg.isl, max(cfg.concurrency) * cfg.requests, corpus)
        if cfg.turns >= 2:
            out["history"] = make_prompts(*text_codec(tok), cfg.history, cfg.repeats, corpus)
            n_new = cfg.repeats * (cfg.turns - 1)
            out["turn"] = make_prompts(*text_codec(tok), cfg.turn_tokens, n_new, corpus[len(corpus) // 2 :])
        if cfg.join_streams:
            n_streams = cfg.join_streams * cfg.repeats
            out["join_streams"] = make_prompts(*text_codec(tok), cfg.isl, n_streams, corpus[len(corpus) // 3 :])
            out["join"] = make_prompts(*text_codec(tok), cfg.join_prompt, cfg.repeats, corpus[len(corpus) // 4 :])
    return out


def _body(prompt: str, max_tokens: int, cache_prompt: bool) -> dict[str, Any]:
    """One request, the same for every engine. timings_per_token: llama-server
    then counts the tokens of every event (pydflash ignores the field)."""
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "ignore_eos": True,
        "cache_prompt": cache_prompt,
        "timings_per_token": True,
    }


def _start(
    stack: ExitStack, engines: Sequence[str], settings: dict[str, Any], slots: int, log_stem: Path,
    commands: dict[str, list[str]],
) -> dict[str, ServerProcess]:  # fmt: skip
    """The engines' servers, stopped when ``stack`` closes; logs: <log_stem>-<engine>.log."""
    servers = {}
    for e in engines:
        log_path = log_stem.with_name(f"{log_stem.name}-{e}.log")
        servers[e] = stack.enter_context(ServerProcess(e, settings, slots, log_path))
        commands[e].append(shlex.join(servers[e].command))
    return servers


def _warm(servers: dict[str, ServerProcess], prompt: str, count: int) -> None:
    for srv in servers.values():
        for _ in range(count):
            stream_completion(srv.url, _body(prompt, 16, cache_prompt=False))


def _rotated(engines: Sequence[str], k: int) -> list[str]:
    k %= len(engines)
    return [*engines[k:], *engines[:k]]


def _sweep(
    cfg: ServingConfig, settings: dict[str, Any], engines: Sequence[str], prompts: list[str], log_dir: Path,
    commands: dict[str, list[str]], log: Log,
) -> list[dict[str, Any]]:  # fmt: skip
    runs: list[dict[str, Any]] = []
    total = len(cfg.concurrency) * cfg.repeats * len(engines)
    per_slot = {**settings, "n_ctx_per_slot": round_up(cfg.isl + cfg.osl + CTX_MARGIN, 256)}
    for level, n in enumerate(cfg.concurrency):
        with ExitStack() as stack:
            servers = _start(stack, engines, per_slot, n, log_dir / f"c{n}", commands)
            _warm(servers, prompts[0], cfg.warmup)
            for r in range(cfg.repeats):
                for e in _rotated(engines, r + level):  # a different engine first run by run
                    wall_s, records = run_streams(servers[e].url, prompts, n, cfg.requests, cfg.osl)
                    runs.append({"engine": e, "concurrency": n, "repeat": r, "wall_s": wall_s, "records": records})
                    tok_s = sum(x.n_tokens for x in records) / wall_s
                    log(f"[{len(runs)}/{total}] {e:18} concurrency {n:2d}: {tok_s:8.1f} tok/s")
    return runs


def run_streams(
    url: str, prompts: Sequence[str], streams: int, per_stream: int, osl: int
) -> tuple[float, list[StreamRecord]]:
    """``streams`` threads, started together, each sending ``per_stream``
    requests in turn (stream i: prompts[i * per_stream ...]); returns the wall
    time from the first request sent to the last stream's end, and the
    records in prompt order."""
    barrier = threading.Barrier(streams)
    out: list[list[StreamRecord]] = [[] for _ in range(streams)]
    errors: list[BaseException] = []

    def stream(i: int) -> None:
        try:
            barrier.wait()
            for j in range(per_stream):
                out[i].append(stream_completion(url, _body(prompts[i * per_stream + j], osl, cache_prompt=False)))
        except BaseException as e:  # re-raised in the caller's thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=stream, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    records = [r for rs in out for r in rs]
    return max(r.t_done for r in records) - min(r.t_sent for r in records), records


def converse(url: str, history: str, new_texts: Sequence[str], osl: int) -> list[StreamRecord]:
    """A conversation: the history, then each turn resends everything so far
    (prompts and outputs) plus its new text; the prompt cache on."""
    prompt = history
    records: list[StreamRecord] = []
    for k in range(len(new_texts) + 1):
        if k:
            prompt = prompt + records[-1].text + "\n" + new_texts[k - 1]
        records.append(stream_completion(url, _body(prompt, osl, cache_prompt=True)))
    return records


def _conversations(
    cfg: ServingConfig, settings: dict[str, Any], engines: Sequence[str], prompts: dict[str, list[str]],
    log_dir: Path, commands: dict[str, list[str]], log: Log,
) -> list[dict[str, Any]]:  # fmt: skip
    if cfg.turns < 2:
        return []
    out: list[dict[str, Any]] = []
    longest = cfg.history + cfg.turns * (cfg.osl + cfg.turn_tokens + 1)
    one_slot = {**settings, "n_ctx_per_slot": round_up(longest + CTX_MARGIN, 256)}
    with ExitStack() as stack:
        servers = _start(stack, engines, one_slot, 1, log_dir / "multi-turn", commands)
        _warm(servers, prompts["turn"][0], cfg.warmup)
        for r in range(cfg.repeats):
            new = prompts["turn"][r * (cfg.turns - 1) : (r + 1) * (cfg.turns - 1)]
            for e in _rotated(engines, r):
                records = converse(servers[e].url, prompts["history"][r], new, cfg.osl)
                out.append({"engine": e, "repeat": r, "records": records})
                detail = ", ".join(f"turn {k + 1} {x.ttft_s * 1e3:.0f} ms ({x.timings.get('cache_n')} cached)"
                                   for k, x in enumerate(records))  # fmt: skip
                log(f"[{r + 1}/{cfg.repeats}] {e:18} time to first token: {detail}")
    return out


def _joins(
    cfg: ServingConfig, settings: dict[str, Any], engines: Sequence[str], prompts: dict[str, list[str]],
    log_dir: Path, commands: dict[str, list[str]], log: Log,
) -> list[dict[str, Any]]:  # fmt: skip
    """The long-prompt-joins workload: a server per engine with join_streams + 1 slots."""
    if not cfg.join_streams:
        return []
    out: list[dict[str, Any]] = []
    n = cfg.join_streams
    longest = max(cfg.isl + cfg.join_osl, cfg.join_prompt + join.JOINER_OSL)
    per_slot = {**settings, "n_ctx_per_slot": round_up(longest + CTX_MARGIN, 256)}
    with ExitStack() as stack:
        servers = _start(stack, engines, per_slot, n + 1, log_dir / "join", commands)
        _warm(servers, prompts["join_streams"][0], cfg.warmup)
        for r in range(cfg.repeats):
            for e in _rotated(engines, r):
                res = join.run_join(
                    servers[e].url, prompts["join_streams"][r * n : (r + 1) * n], prompts["join"][r], cfg.join_osl,
                    lambda prompt, max_tokens: _body(prompt, max_tokens, cache_prompt=False),
                )  # fmt: skip
                out.append({"engine": e, "repeat": r, **res})
                start, end = join.window(res, cfg.join_margin_ms / 1e3)
                inside = [g for rec in res["streams"] for g, _ in join.gaps(rec, start, end)]
                log(
                    f"[{r + 1}/{cfg.repeats}] {e:18} long prompt joins: its TTFT {res['joiner'].ttft_s * 1e3:.0f} ms, "
                    f"the running streams' longest gap in the window {max(inside, default=0) * 1e3:.0f} ms"
                )
    return out
