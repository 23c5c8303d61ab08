"""One engine in its own process, driven by `pydflash bench` over stdin/stdout
(one JSON request per line, one JSON reply per line). Separate processes give
each engine its own peak RSS and keep a crash or a slow import out of the
parent. Engines: ``pydflash`` (target alone or with a drafter) and
``llama-cpp-python`` (target alone; optional)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from ..config import FLASH_ATTN

Request = dict[str, Any]  # {"text", "osl", "draft_max"} from the parent
Reply = dict[str, Any]  # one measurement (see engines.py), JSON values


def peak_rss_bytes() -> int:
    """The process's peak resident set (VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def pydflash_engine(a: argparse.Namespace) -> tuple[Callable[[Request], Reply], dict[str, Any]]:
    from ..llama import Llama

    # an MTP head's draft length is fixed when the pair is made: remade for another one
    mtp = "draft-mtp" in (a.spec_type or "").split(",")
    # n-gram tables (ngram-mod's above all) outlive a generation: a pair is remade per run
    # so each starts cold, as llama.cpp's loop does per prompt (a repeated prompt would
    # otherwise be drafted whole from the last run's table)
    ngram = any(t.startswith("ngram") for t in (a.spec_type or "").split(","))

    def make(draft_max: int | None) -> Llama:
        return Llama(
            a.target,
            draft=a.draft,
            n_ctx=a.n_ctx,
            n_threads=a.threads,
            n_batch=a.n_batch,
            flash_attn=a.flash_attn,
            speculative=a.spec_type,
            draft_max=draft_max,
            draft_window=a.draft_window,
        )

    llm = make(None)
    mem = llm.memory()
    info = {
        "memory": {
            "target_bytes": mem.target_bytes,
            "drafter_bytes": mem.drafter_bytes,
            "rows": [
                dict(role=r.role, buffer=r.buffer, model=r.model, context=r.context, compute=r.compute)
                for r in mem.rows
            ],
        },
        "block_size": llm.pair.block_size,
        "max_draft": llm.pair.max_draft,
        "draft_window": llm.pair.draft_window,
    }

    def run(req: Request) -> Reply:
        nonlocal llm
        prompt = llm.tokenize(req["text"], special=True)
        dm = req.get("draft_max") if a.draft or a.spec_type else 0  # None: the adaptive draft length
        if ngram or (mtp and dm is not None and dm != llm.pair.max_draft):
            llm.close()
            llm = make(dm if mtp else None)
        # a cold prefill every time, as the other engines do (repeats reuse prompts)
        res = llm.generate(prompt, max_tokens=req["osl"], ignore_eos=True, draft_max=dm, cache_prompt=False)
        s = res.stats
        first = s.steps[0] if s.steps else None
        first_ms = (first.t_draft_ms + first.t_verify_ms + first.t_inject_ms + first.t_sample_ms) if first else 0.0
        return {
            "isl": len(prompt),
            "n_generated": len(res.tokens),
            "prefill_s": s.prefill_seconds,
            "decode_s": s.decode_seconds,
            "ttft_s": s.prefill_seconds + first_ms / 1e3,
            "n_steps": s.n_steps,
            "n_drafted": s.n_drafted,
            "n_accepted": s.n_accepted,
            "mean_draft_len": sum(s.draft_lengths) / len(s.draft_lengths) if s.draft_lengths else 0.0,
            "tokens_head": res.tokens[:32],
        }

    return run, info


def llama_cpp_python_engine(a: argparse.Namespace) -> tuple[Callable[[Request], Reply], dict[str, Any]]:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=a.target,
        n_ctx=a.n_ctx,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_batch=a.n_batch,
        verbose=False,
        # a bool there; "auto" resolves to enabled on the CPU (llama.cpp logs it)
        flash_attn=a.flash_attn != "off",
    )

    def run(req: Request) -> Reply:
        prompt = llm.tokenize(req["text"].encode(), add_bos=True, special=True)
        llm.reset()
        tokens: list[int] = []
        t0 = time.perf_counter()
        t_first = t0
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            tokens.append(tok)
            if len(tokens) == 1:
                t_first = time.perf_counter()
            if len(tokens) >= req["osl"]:
                break
        t_end = time.perf_counter()
        # first token = prompt pass + one sample; the rest is decode
        n = len(tokens)
        return {
            "isl": len(prompt),
            "n_generated": n,
            "prefill_s": t_first - t0,
            "decode_s": (t_end - t_first) * n / max(n - 1, 1),
            "ttft_s": t_first - t0,
            "n_steps": n,
            "n_drafted": 0,
            "n_accepted": 0,
            "tokens_head": tokens[:32],
        }

    return run, {"version": llama_cpp.__version__}


ENGINES = {"pydflash": pydflash_engine, "llama-cpp-python": llama_cpp_python_engine}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=sorted(ENGINES), required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--n-ctx", type=int, required=True)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--spec-type", help="llama.cpp's --spec-type list (pydflash engine)")
    ap.add_argument("--draft-window", type=int, help="the drafter's window (pydflash engine; default: pydflash's)")
    a = ap.parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr  # a chatty library must not corrupt the protocol
    try:
        run, info = ENGINES[a.engine](a)
    except Exception as e:  # reported to the parent, which skips this engine
        out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ready": True, **info}) + "\n")
    out.flush()
    for line in sys.stdin:
        req: dict[str, Any] = json.loads(line)
        try:
            reply = run(req)
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}"}
        reply["rss_peak_bytes"] = peak_rss_bytes()
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
