"""The ``pydflash`` command line: generate, demo, bench, serve, info, rpc-server."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import textwrap
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _core, backends
from .config import CACHE_TYPES, FLASH_ATTN, SPLIT_MODES, ModelConfig
from .errors import PyDFlashError
from .llama import Llama
from .results import GenerationResult


def _add_common(p: argparse.ArgumentParser) -> None:
    d = ModelConfig()  # the core's defaults
    p.add_argument("--n-ctx", type=int, default=d.n_ctx, help="context size in tokens (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    dev = p.add_argument_group("devices and KV cache (as llama.cpp's options of the same names)")
    dev.add_argument("-ngl", "--n-gpu-layers", type=int, default=d.n_gpu_layers,
                     help="target layers to offload; -1 = all (default: %(default)s)")
    dev.add_argument("-ngld", "--draft-n-gpu-layers", type=int, default=None,
                     help="drafter layers to offload (default: as --n-gpu-layers)")
    dev.add_argument("-sm", "--split-mode", choices=SPLIT_MODES, default=d.split_mode,
                     help="how layers spread over several GPUs (default: %(default)s)")
    dev.add_argument("-mg", "--main-gpu", type=int, default=d.main_gpu, help="the GPU used with --split-mode none")
    dev.add_argument("-ts", "--tensor-split", type=lambda t: tuple(float(x) for x in t.split(",")), default=(),
                     metavar="SHARES", help="share of the model per GPU, e.g. 3,1 (default: by free memory)")
    dev.add_argument("--rpc", default="", metavar="SERVERS",
                     help="host:port of RPC servers, comma-separated (see `pydflash rpc-server`)")
    dev.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN, default=d.flash_attn, help="(default: %(default)s)")
    dev.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default=d.type_k, help="target K cache type")
    dev.add_argument("-ctv", "--cache-type-v", choices=CACHE_TYPES, default=d.type_v,
                     help="target V cache type (quantized needs flash attention)")
    dev.add_argument("-ctkd", "--cache-type-k-draft", choices=CACHE_TYPES, default=d.draft_type_k,
                     help="drafter K cache type")
    dev.add_argument("-ctvd", "--cache-type-v-draft", choices=CACHE_TYPES, default=d.draft_type_v,
                     help="drafter V cache type")


def _llama_options(a: argparse.Namespace) -> dict[str, Any]:
    """Llama's keyword options from _add_common's flags."""
    return dict(n_ctx=a.n_ctx, n_threads=a.threads, verbose=a.verbose, n_gpu_layers=a.n_gpu_layers,
                draft_n_gpu_layers=a.draft_n_gpu_layers, split_mode=a.split_mode, main_gpu=a.main_gpu,
                tensor_split=a.tensor_split, rpc_servers=a.rpc, flash_attn=a.flash_attn, type_k=a.cache_type_k,
                type_v=a.cache_type_v, draft_type_k=a.cache_type_k_draft, draft_type_v=a.cache_type_v_draft)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pydflash",
        description="DFlash speculative decoding of GGUF models with llama.cpp, in-process.")
    from . import __version__
    ap.add_argument("--version", action="version", version=f"pydflash {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_generate(sub)
    _add_demo(sub)
    _add_bench(sub)
    _add_serve(sub)
    _add_info(sub)
    _add_rpc_server(sub)
    return ap


def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("generate", help="generate text from a prompt and print speculative stats",
                       description="Generate from PROMPT with TARGET (and a DFlash DRAFT), print the "
                                   "text and the decoding stats.")
    g.add_argument("-m", "--model", required=True, metavar="TARGET", help="target GGUF file")
    g.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF file (omit: target alone)")
    g.add_argument("-p", "--prompt", required=True, help="prompt text")
    g.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate (default: %(default)s)")
    g.add_argument("--draft-max", type=int, default=None, help="draft tokens per step (default: block size - 1)")
    g.add_argument("--draft-min", type=int, default=0,
                   help="drop a draft shorter than this; decode that step with the target alone (default: %(default)s)")
    g.add_argument("--draft-p-min", type=float, default=0.0,
                   help="cut the draft where the drafter's confidence falls below this, 0..1 (default: %(default)s)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-text")
    g.add_argument("--stream", action="store_true", help="print text as it is generated")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_common(g)


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("demo", help="DFlash vs the target alone on a built-in pair, no arguments needed",
                       description="Run the embedded trained pair (a Python-code target and its DFlash "
                                   "drafter) with DFlash and with the target alone on a few code prompts; "
                                   "print the text, tokens/s of both, the speed-up, tau (tokens per target "
                                   "pass), the acceptance rate and the per-step acceptance.")
    d.add_argument("--prompt", action="append", help="prompt (repeatable; default: built-in prompts)")
    d.add_argument("--max-tokens", type=int, default=96, help="tokens per prompt (default: %(default)s)")
    d.add_argument("--draft-max", type=int, default=None, help="draft tokens per step (default: block size - 1)")
    d.add_argument("--pad-ffn", type=int, default=16384, metavar="N",
                   help="decode with a memory-bound copy of the target whose FFN is zero-padded to N "
                        "(identical outputs; like a large model, its decode is bound by reading weights, "
                        "which is what DFlash speeds up); 0 = the small target as is (default: %(default)s)")
    _add_common(d)


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with speculative /metrics",
                       description="Serve one target + DFlash drafter pair over HTTP, OpenAI-compatible: "
                                   "POST /v1/completions and /v1/chat/completions (stream: server-sent events), "
                                   "GET /v1/models, /health, and /metrics (Prometheus text with tokens drafted "
                                   "and accepted, acceptance rate, accepted length per step, tokens/s). One "
                                   "generation runs at a time; other requests wait. Without -m: the embedded pair.",
                       epilog="example: pydflash serve -m target.gguf -d drafter.gguf --port 8080, then "
                              "openai.OpenAI(base_url='http://127.0.0.1:8080/v1', api_key='none')")
    s.add_argument("-m", "--model", metavar="TARGET", help="target GGUF file (default: the embedded pair)")
    s.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF file (omit: target alone)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=int, default=8080, help="port; 0 = any free port (default: %(default)s)")
    s.add_argument("--alias", default=None, help="model id reported by /v1/models (default: the file name)")
    s.add_argument("--draft-max", type=int, default=None, help="draft tokens per step (default: block size - 1)")
    s.add_argument("--chat-template", default=None, metavar="TEMPLATE",
                   help="jinja source, a file holding it, or a llama.cpp built-in name "
                        "(default: the GGUF's own template, ChatML if it has none)")
    _add_common(s)


def _add_info(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = sub.add_parser("info", help="backends, model metadata, and whether a drafter fits a target",
                       description="Print the compute backends; with -m and/or -d, each file's metadata "
                                   "(with -m, also how rejected draft tokens are rolled back on that target: "
                                   "kv-trim, recurrent-planes or checkpoint); with both, whether the drafter can "
                                   "drive the target. Generates nothing.")
    i.add_argument("-m", "--model", metavar="TARGET", help="target GGUF file")
    i.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF file")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")


def _add_rpc_server(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("rpc-server", help="serve this machine's CPU to other pydflash / llama.cpp processes (RPC)",
                       description="Run ggml's RPC server (as llama.cpp's rpc-server) on this machine's CPU "
                                   "backend: a Llama(..., rpc_servers=['HOST:PORT'], n_gpu_layers=-1) elsewhere "
                                   "offloads its layers here. Runs until interrupted. The protocol has no "
                                   "authentication or encryption: listen on a trusted network only.")
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    r.add_argument("-p", "--port", type=int, default=50052, help="(default: %(default)s)")
    r.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all cores)")
    r.add_argument("-c", "--cache-dir", default="", help="keep received tensors here to load faster next time")


def _stats_line(res: GenerationResult) -> str:
    s = res.stats
    return (f"tokens={s.n_tokens} steps={s.n_steps} drafted={s.n_drafted} accepted={s.n_accepted} "
            f"acceptance={s.acceptance_rate:.3f} tau={s.mean_accepted_length:.3f} "
            f"decode={s.decode_tokens_per_second:.1f} tok/s prefill={s.prefill_tokens_per_second:.1f} tok/s "
            f"finish={res.finish_reason}")


def _cmd_generate(a: argparse.Namespace) -> int:
    with Llama(a.model, draft=a.draft, draft_max=a.draft_max, seed=a.seed, **_llama_options(a)) as llm:
        kw = dict(max_tokens=a.max_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                  seed=a.seed, ignore_eos=a.ignore_eos, draft_min=a.draft_min, draft_p_min=a.draft_p_min)
        if a.stream and not a.json:
            for step in llm.stream(a.prompt, **kw):
                sys.stdout.write(step.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            return 0
        res = llm.generate(a.prompt, **kw)
        if a.json:
            s = res.stats
            print(json.dumps({"text": res.text, "tokens": res.tokens, "finish_reason": res.finish_reason,
                              "stats": {"n_steps": s.n_steps, "n_drafted": s.n_drafted, "n_accepted": s.n_accepted,
                                        "acceptance_rate": s.acceptance_rate,
                                        "mean_accepted_length": s.mean_accepted_length,
                                        "decode_tokens_per_second": s.decode_tokens_per_second}}))
        else:
            print(res.text)
            print(_stats_line(res), file=sys.stderr)
    return 0


def _model_summary(m: _core.Model) -> dict[str, Any]:
    keep = ("general.name", "general.architecture")
    meta = {k: v for k, v in m.metadata.items() if not k.startswith("tokenizer.ggml.") or k in keep}
    return {"path": m.path, "architecture": m.architecture, "description": m.description,
            "n_params": m.n_params, "size_bytes": m.size_bytes, "n_embd": m.n_embd, "n_layer": m.n_layer,
            "n_vocab": m.n_vocab, "n_ctx_train": m.n_ctx_train, "recurrent": m.is_recurrent,
            "hybrid": m.is_hybrid, "chat_template": _template_summary(m), "metadata": meta}


def _template_summary(m: _core.Model) -> str:
    src = m.metadata.get("tokenizer.chat_template")
    if not src:
        return "none (chat uses ChatML)"
    try:
        from .chat import ChatTemplate

        thinking = ChatTemplate(m).supports_thinking
    except PyDFlashError as e:
        return f"jinja, {len(src)} chars, does not parse: {e}"
    return f"jinja, {len(src)} chars" + (", reasoning on/off" if thinking else "")


_ROLLBACK_NOTES = {
    "kv-trim": " (rejected draft tokens are trimmed from the KV cache)",
    "recurrent-planes": " (hybrid: llama.cpp keeps block_size - 1 recurrent-state planes for partial rollback)",
    "checkpoint": " (hybrid: the recurrent state is saved before each verification, restored and replayed "
                  "on a partial acceptance)",
}


def _cmd_info(a: argparse.Namespace) -> int:
    from . import _logging
    _logging.set_verbose(a.verbose)
    out: dict[str, Any] = {"backends": backends(), "backend_modules": _core.backend_load_report(),
                 "dynamic_backends": _core.dynamic_backends(), "rpc": _core.rpc_available(),
                 "system_info": _core.system_info().strip()}
    target = draft = None
    try:
        if a.model:
            target = _core.Model.load(a.model, _core.ModelParams(), "target")
            out["target"] = _model_summary(target)
            out["target"]["rollback"] = target.rollback_for_drafting()
        if a.draft:
            draft = _core.Model.load_drafter(a.draft, _core.ModelParams())
            out["drafter"] = _model_summary(draft)
        if target is not None and draft is not None:
            why = target.drafter_incompatibility(draft)
            out["compatible"] = not why
            if why:
                out["incompatibility"] = why
    finally:
        _logging.flush()
    if a.json:
        print(json.dumps(out, indent=2))
        return 0 if out.get("compatible", True) else 1
    print("backends: " + ", ".join(f"{b['name']} ({b['description']}; {b['type']}, {b['memory_total'] / 2**30:.1f} GiB)"
                                   for b in out["backends"]))
    if out["dynamic_backends"]:
        for m in out["backend_modules"]:
            state = f"{m['n_devices']} device(s)" if m["loaded"] else "not loaded"
            why = f" - {m['error']}" if m["error"] else ""
            print(f"module:   {m['name']} ({m['path'] or 'built in'}): {state}{why}")
    else:
        print("modules:  linked in (" + ", ".join(str(m["name"]) for m in out["backend_modules"]) + ")")
    print(f"rpc:      {'built in (pydflash rpc-server; Llama(rpc_servers=...))' if out['rpc'] else 'not built'}")
    print("system:   " + out["system_info"])
    for role in ("target", "drafter"):
        if role in out:
            s = out[role]
            print(f"\n{role}: {s['path']}")
            for k in ("architecture", "description", "n_params", "size_bytes", "n_embd", "n_layer", "n_vocab",
                      "n_ctx_train", "recurrent", "hybrid", "rollback", "chat_template"):
                if k in s:
                    print(f"  {k:<13} {s[k]}{_ROLLBACK_NOTES.get(s[k], '') if k == 'rollback' else ''}")
            for k, v in sorted(s["metadata"].items()):
                v = str(v)
                print(f"  {k} = " + (v if len(v) <= 120 and "\n" not in v else repr(v[:100]) + f"... ({len(v)} chars)"))
    if "compatible" in out:
        print("\ndrafter fits target: " + ("yes" if out["compatible"] else "NO - " + out["incompatibility"]))
        return 0 if out["compatible"] else 1
    return 0


DEMO_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n",
    "class Stack:\n    def __init__(self):\n",
    "    for i in range(len(items)):\n",
)


def _demo_pair(workdir: Path) -> tuple[str, str, str]:
    from .embedded import embedded_pair

    try:
        t, d = embedded_pair()
        return t, d, "embedded pair: trained Python-code qwen3 target + DFlash drafter (models/MODEL_CARD.md)"
    except PyDFlashError:
        from . import testing  # the tiny random pair needs gguf + numpy
        tp, dp = testing.write_pair(workdir, prefix="demo")
        return str(tp), str(dp), "embedded pair missing: tiny random-weight pair (acceptance near zero)"


def _piece(llm: Llama, tokens: Sequence[int]) -> str:
    return repr(llm.detokenize(list(tokens)))[1:-1]


def _cmd_demo(a: argparse.Namespace) -> int:
    prompts = a.prompt or list(DEMO_PROMPTS)
    with tempfile.TemporaryDirectory(prefix="pydflash-demo-") as td:
        target, draft, what = _demo_pair(Path(td))
        print(what)
        if a.pad_ffn:
            from .padding import pad_ffn
            target = str(pad_ffn(target, Path(td) / "target-padded.gguf", a.pad_ffn))
            print(f"target: memory-bound copy, FFN zero-padded to {a.pad_ffn} (same outputs; --pad-ffn 0 for "
                  f"the small target as is)")
        common = _llama_options(a)
        with Llama(target, draft=draft, draft_max=a.draft_max, **common) as spec, Llama(target, **common) as base:
            # warm both up once so the first timing is not a cold start
            base.generate(prompts[0], max_tokens=8, ignore_eos=True)
            spec.generate(prompts[0], max_tokens=8, ignore_eos=True)
            tot_spec = tot_base = 0.0
            n_tok = n_steps = n_drafted = n_accepted = 0
            for prompt in prompts:
                rb = base.generate(prompt, max_tokens=a.max_tokens, ignore_eos=True)
                rs = spec.generate(prompt, max_tokens=a.max_tokens, ignore_eos=True)
                tot_base += rb.stats.decode_seconds
                tot_spec += rs.stats.decode_seconds
                n_tok += len(rs.tokens)
                n_steps += rs.stats.n_steps
                n_drafted += rs.stats.n_drafted
                n_accepted += rs.stats.n_accepted
                print("\n" + "=" * 72)
                print(prompt + rs.text)
                print("-" * 72)
                print(f"identical to the target alone: {rs.tokens == rb.tokens}")
                print(f"target alone: {rb.stats.decode_tokens_per_second:8.1f} tok/s")
                print(f"DFlash:       {rs.stats.decode_tokens_per_second:8.1f} tok/s   "
                      f"speed-up {rb.stats.decode_seconds / max(rs.stats.decode_seconds, 1e-9):.2f}x   "
                      f"tau {rs.stats.mean_accepted_length:.2f}   acceptance {rs.stats.acceptance_rate:.3f}")
                print("steps: [accepted drafts] ~first rejected draft~ +the target's own token")
                for st in rs.stats.steps[:10]:
                    rej = st.drafted[st.n_accepted:st.n_accepted + 1]
                    print(f"  {st.n_accepted}/{st.n_drafted}  [{_piece(spec, st.drafted[:st.n_accepted])}]"
                          + (f" ~{_piece(spec, rej)}~" if rej else "") + f" +{_piece(spec, st.tokens[-1:])}")
                if len(rs.stats.steps) > 10:
                    print(f"  ... {len(rs.stats.steps) - 10} more steps")
            print("\n" + "=" * 72)
            print(f"overall: speed-up {tot_base / max(tot_spec, 1e-9):.2f}x, "
                  f"tau {n_tok / max(n_steps, 1):.2f} tokens per target pass, "
                  f"acceptance {n_accepted / max(n_drafted, 1):.3f}")
    return 0


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from .bench.run import ENGINES
    b = sub.add_parser(
        "bench", help="benchmark pydflash vs llama.cpp's own DFlash loop vs the target alone",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "Measure, in one run with engines alternating run by run: pydflash target-only, pydflash "
                    "DFlash, llama.cpp's native DFlash loop (llama-speculative-simple, built from the vendored "
                    "tree with tools/build_native.py) and llama-cpp-python (if installed). Greedy, one request at "
                    "a time, EOS ignored so every request generates exactly OSL tokens; an ISL = OSL sweep at one "
                    "draft_max and a draft_max sweep at the smallest ISL; medians over repeats.", 100),
        epilog="examples:\n  pydflash bench --quick --json bench.json\n"
               "  pydflash bench --isl 512,4096,12288,36864 -m target.gguf -d drafter.gguf --json out.json")
    b.add_argument("--quick", action="store_true", help="a small sweep (ISL 64,256; 2 repeats): under 5 minutes")
    b.add_argument("-m", "--model", metavar="TARGET", help="target GGUF (default: the embedded pair)")
    b.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF (with -m)")
    b.add_argument("--pad-ffn", type=int, default=None, metavar="N",
                   help="benchmark a memory-bound copy of the target with its FFN zero-padded to N (same outputs;"
                        " default: 16384 for the embedded pair, 0 = as is for -m)")
    b.add_argument("--isl", type=_ints, help="input lengths, comma-separated (default: 128,512,2048)")
    b.add_argument("--osl", type=_ints, help="output lengths, one per ISL (default: OSL = ISL)")
    b.add_argument("--draft-max", type=_ints, help="draft_max sweep (default: 1,2,4,8,12,15 as the block allows)")
    b.add_argument("--ctx-draft-max", type=int, help="draft_max of the context sweep (default: block size - 1)")
    b.add_argument("--repeats", type=int, help="timed runs per configuration (default: 3; --quick: 2)")
    b.add_argument("--warmup", type=int, default=1, help="warm-up runs per engine (default: %(default)s)")
    b.add_argument("--engines", type=lambda t: tuple(x for x in t.split(",") if x),
                   help=f"comma-separated subset of {','.join(ENGINES)}")
    b.add_argument("--native", metavar="PATH", help="llama-speculative-simple binary (default: "
                                                    "build/native/bin/ here, then PATH)")
    b.add_argument("--threads", type=int, default=0, help="CPU threads for every engine (default: all cores)")
    b.add_argument("--no-bandwidth", action="store_true", help="skip the memory-bandwidth measurement")
    b.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN,
                   help="flash attention in every engine alike (default: auto, llama.cpp's default, which is "
                        "on for the CPU; llama-cpp-python takes a bool: on unless off)")
    b.add_argument("--json", type=Path, metavar="PATH", help="write rows + metadata as JSON")
    b.add_argument("--csv", type=Path, metavar="PATH", help="write rows as CSV")
    b.add_argument("--charts", type=Path, metavar="DIR", help="write PNG charts here (needs matplotlib)")


def _cmd_bench(a: argparse.Namespace) -> int:
    from .bench import BenchConfig, report, run

    if (a.model is None) != (a.draft is None):
        raise ValueError("give both -m TARGET and -d DRAFT, or neither (the embedded pair)")
    changes = {k: v for k, v in dict(
        target=a.model, draft=a.draft, pad_ffn=a.pad_ffn, isl=a.isl, osl=a.osl, draft_max=a.draft_max,
        ctx_draft_max=a.ctx_draft_max, repeats=a.repeats, warmup=a.warmup, engines=a.engines, native=a.native,
        threads=a.threads, flash_attn=a.flash_attn).items() if v is not None}
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


def _cmd_serve(a: argparse.Namespace) -> int:
    from .server import Server, serve

    model, draft = a.model, a.draft
    if model is None:
        from .embedded import embedded_pair

        model, default_draft = embedded_pair()
        draft = draft or default_draft
    template = a.chat_template
    if template and Path(template).is_file():
        template = Path(template).read_text(encoding="utf-8")

    def ready(srv: Server) -> None:
        print(f"pydflash: serving {srv.alias} on {srv.url} (OpenAI API at {srv.url}/v1)", file=sys.stderr,
              flush=True)

    serve(model, draft, host=a.host, port=a.port, alias=a.alias, ready=ready, draft_max=a.draft_max,
          chat_template=template, **_llama_options(a))
    return 0


def _cmd_rpc_server(a: argparse.Namespace) -> int:
    if not 0 < a.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {a.port}")
    if a.cache_dir:
        Path(a.cache_dir).mkdir(parents=True, exist_ok=True)
    print(f"pydflash: RPC server on {a.host}:{a.port} (CPU backend; Ctrl-C to stop)", file=sys.stderr, flush=True)
    # ggml's server loop never returns and does not poll Python's signals: run
    # it in a daemon thread and wait here, where Ctrl-C and SIGTERM arrive.
    t = threading.Thread(target=_core.serve_rpc, args=(f"{a.host}:{a.port}", a.threads, a.cache_dir), daemon=True)
    t.start()

    def leave(code: int) -> None:
        # os._exit: interpreter shutdown would free ggml state under the running server thread
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    signal.signal(signal.SIGTERM, lambda *_: leave(0))
    try:
        while t.is_alive():
            t.join(0.5)
    except KeyboardInterrupt:
        leave(130)
    return 1  # the server stopped by itself: it could not bind or start (see its message above)


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(a, "verbose", False) else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        return {"generate": _cmd_generate, "demo": _cmd_demo, "bench": _cmd_bench, "serve": _cmd_serve,
                "info": _cmd_info, "rpc-server": _cmd_rpc_server}[a.command](a)
    except (PyDFlashError, ValueError, TypeError) as e:
        print(f"pydflash: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
