"""The ``pydflash`` command line: generate, demo, bench, serve, info, rpc-server, train-drafter."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import _core
from ..config import SamplingConfig
from ..devices import backends
from ..embedded import embedded_pair
from ..errors import PyDFlashError
from ..llama import Llama
from ..options import OPTIONS
from . import bench as bench_command
from . import demo as demo_command
from . import train as train_command
from .common import DRAFT_MAX_HELP, add_common, llama_options, stats_line
from .serve import add_serve, cmd_serve


def build_parser() -> argparse.ArgumentParser:
    """The ``pydflash`` command line's parser, every subcommand included."""
    ap = argparse.ArgumentParser(
        prog="pydflash", description="DFlash speculative decoding of GGUF models with llama.cpp, in-process."
    )
    ap.add_argument("--version", action="version", version=f"pydflash {_core.__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_generate(sub)
    demo_command.add_parser(sub)
    bench_command.add_parser(sub)
    add_serve(sub)
    _add_info(sub)
    _add_rpc_server(sub)
    train_command.add_parser(sub)
    return ap


def _add_generate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser(
        "generate",
        help="generate text from a prompt and print speculative stats",
        description="Generate from PROMPT with TARGET (and a DFlash DRAFT), print the text and the decoding stats. "
        "Without -m: the embedded pair. Flags as llama.cpp's (-m, -md, -p, -n, -c, -t, -ngl, -s, --temp ...).",
    )
    g.add_argument("-m", "--model", metavar="TARGET", help="target GGUF file (default: the embedded pair)")
    g.add_argument(
        "-d", "-md", "--draft", "--model-draft", metavar="DRAFT", help="DFlash drafter GGUF file (omit: target alone)"
    )
    g.add_argument("-p", "--prompt", default=DEFAULT_PROMPT, help="prompt text (default: %(default)r)")
    g.add_argument(
        "-n",
        "--n-predict",
        "--max-tokens",
        dest="max_tokens",
        type=int,
        default=128,
        help="tokens to generate (default: %(default)s)",
    )
    g.add_argument("--draft-max", type=int, default=None, help=DRAFT_MAX_HELP)
    g.add_argument(
        "--draft-min",
        type=int,
        default=0,
        help="drop a draft shorter than this; decode that step with the target alone (default: %(default)s)",
    )
    g.add_argument(
        "--draft-p-min",
        type=float,
        default=0.0,
        help="cut the draft where the drafter's confidence falls below this, 0..1 (default: %(default)s)",
    )
    _add_sampling(g)
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-text")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--grammar", metavar="GBNF", help="the output follows this GBNF grammar (llama.cpp's format)")
    c.add_argument("--grammar-file", metavar="FILE", help="the output follows the GBNF grammar in FILE")
    c.add_argument("-j", "--json-schema", metavar="SCHEMA", help="the output is JSON valid against this schema")
    c.add_argument("--json-schema-file", metavar="FILE", help="the output is JSON valid against the schema in FILE")
    _add_declared(g)
    g.add_argument("--stream", action="store_true", help="print text as it is generated")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    add_common(g)


DEFAULT_PROMPT = "def fibonacci(n):\n"


def _add_sampling(g: argparse.ArgumentParser) -> None:
    """llama.cpp's sampler flags, with pydflash's defaults (SamplingConfig's: greedy)."""
    d = SamplingConfig()
    s = g.add_argument_group("sampling (as llama.cpp's options of the same names; the chain applies to the drafts too)")
    s.add_argument(
        "--temp",
        "--temperature",
        dest="temperature",
        type=float,
        default=d.temperature,
        help="0 = greedy (default: %(default)s)",
    )
    s.add_argument("--top-k", type=int, default=d.top_k, help="0 = off (default: %(default)s)")
    s.add_argument("--top-p", type=float, default=d.top_p, help="1.0 = off (default: %(default)s)")
    s.add_argument("--min-p", type=float, default=d.min_p, help="0.0 = off (default: %(default)s)")
    s.add_argument(
        "--typical",
        dest="typical_p",
        type=float,
        default=d.typical_p,
        help="locally typical sampling, 1.0 = off (default: %(default)s)",
    )
    s.add_argument(
        "--top-nsigma", dest="top_n_sigma", type=float, default=d.top_n_sigma, help="-1 = off (default: %(default)s)"
    )
    s.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty, help="1.0 = off (default: %(default)s)")
    s.add_argument(
        "--repeat-last-n",
        dest="penalty_last_n",
        type=int,
        default=d.penalty_last_n,
        help="tokens the penalties look back over; -1 = the context (default: %(default)s)",
    )
    s.add_argument("--presence-penalty", type=float, default=d.presence_penalty, help="0 = off (default: %(default)s)")
    s.add_argument(
        "--frequency-penalty", type=float, default=d.frequency_penalty, help="0 = off (default: %(default)s)"
    )
    s.add_argument("-s", "--seed", type=int, default=-1, help="-1 = random (default: %(default)s)")


def _add_declared(g: argparse.ArgumentParser) -> None:
    """A flag for each option the declaration (options.py) names for the CLI that the flags
    above do not write out (with their own help): its name as given there, its dest the option's."""
    for o in OPTIONS:
        flag = o.names["cli"]
        if flag is None:
            continue
        kind: dict[str, Any] = {"action": "store_true"} if o.json is bool else {"type": o.json, "default": o.default}
        with contextlib.suppress(argparse.ArgumentError):  # written out above
            g.add_argument(flag, dest=o.name, help=f"{o.name} (as generate()'s; default: the core's)", **kind)


# the options generate_options converts itself (llama.cpp's negative values, files, the Llama's draft_max)
_CONVERTED = ("max_tokens", "temperature", "top_k", "draft_max", "grammar", "json_schema")


def generate_options(a: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """``generate``'s flags as (``Llama``'s keyword options, ``generate``'s), negative values
    read as llama.cpp reads them: ``-n`` -1 (or -2) until EOS or a full context, ``--temp``
    below 0 greedy, ``--top-k`` below 1 off; ``--repeat-last-n`` -1 (the context) stays -1
    for the command to resolve once the model's context is known."""
    llama = dict(draft_max=a.draft_max, seed=a.seed, **llama_options(a))
    # the declared options by their dests (each flag's dest is the option's name)
    kw: dict[str, Any] = {o.name: getattr(a, o.name) for o in OPTIONS if o.names["cli"] and o.name not in _CONVERTED}
    kw.update(
        max_tokens=None if a.max_tokens in (-1, -2) else a.max_tokens,
        temperature=max(a.temperature, 0.0),
        top_k=max(a.top_k, 0),
        **_structured(a),
    )
    return llama, kw


def _structured(a: argparse.Namespace) -> dict[str, str]:
    """--grammar/--grammar-file/--json-schema/--json-schema-file as generate()'s options."""
    if a.grammar is not None:
        return {"grammar": a.grammar}
    if a.json_schema is not None:
        return {"json_schema": a.json_schema}
    for flag, option in ((a.grammar_file, "grammar"), (a.json_schema_file, "json_schema")):
        if flag is not None:
            with open(flag, encoding="utf-8") as f:
                return {option: f.read()}
    return {}


def _add_info(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    i = sub.add_parser(
        "info",
        help="backends, model metadata, and whether a drafter fits a target",
        description="Print the compute backends; with -m and/or -d, each file's metadata "
        "(with -m, also how rejected draft tokens are rolled back on that target: "
        "kv-trim, recurrent-planes or checkpoint); with both, whether the drafter can "
        "drive the target. Generates nothing.",
    )
    i.add_argument("-m", "--model", metavar="TARGET", help="target GGUF file")
    i.add_argument("-d", "--draft", metavar="DRAFT", help="DFlash drafter GGUF file")
    i.add_argument("--json", action="store_true", help="print JSON")
    i.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")


def _add_rpc_server(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser(
        "rpc-server",
        help="serve this machine's CPU to other pydflash / llama.cpp processes (RPC)",
        description="Run ggml's RPC server (as llama.cpp's rpc-server) on this machine's CPU "
        "backend: a Llama(..., rpc_servers=['HOST:PORT'], n_gpu_layers=-1) elsewhere "
        "offloads its layers here. Runs until interrupted. The protocol has no "
        "authentication or encryption: listen on a trusted network only.",
    )
    r.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    r.add_argument("-p", "--port", type=int, default=50052, help="(default: %(default)s)")
    r.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (default: all cores)")
    r.add_argument("-c", "--cache-dir", default="", help="keep received tensors here to load faster next time")


def _cmd_generate(a: argparse.Namespace) -> int:
    model, draft = a.model, a.draft
    if model is None:
        if draft is not None:
            print("pydflash generate: error: -d needs -m (the drafter's target)", file=sys.stderr)
            return 2
        model, draft = embedded_pair()
    llama, kw = generate_options(a)
    with Llama(model, draft=draft, **llama) as llm:
        if kw["penalty_last_n"] == -1:  # llama.cpp's -1: the whole context
            kw["penalty_last_n"] = llm.n_ctx_slot
        if a.stream and not a.json:
            for step in llm.stream(a.prompt, **kw):
                sys.stdout.write(step.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            return 0
        res = llm.generate(a.prompt, **kw)
        if a.json:
            s = res.stats
            print(
                json.dumps(
                    {
                        "text": res.text,
                        "tokens": res.tokens,
                        "finish_reason": res.finish_reason,
                        "stats": {
                            "n_steps": s.n_steps,
                            "n_drafted": s.n_drafted,
                            "n_accepted": s.n_accepted,
                            "acceptance_rate": s.acceptance_rate,
                            "mean_accepted_length": s.mean_accepted_length,
                            "decode_tokens_per_second": s.decode_tokens_per_second,
                        },
                    }
                )
            )
        else:
            print(res.text)
            print(stats_line(res), file=sys.stderr)
    return 0


def _model_summary(m: _core.Model) -> dict[str, Any]:
    keep = ("general.name", "general.architecture")
    meta = {k: v for k, v in m.metadata.items() if not k.startswith("tokenizer.ggml.") or k in keep}
    return {
        "path": m.path,
        "architecture": m.architecture,
        "description": m.description,
        "n_params": m.n_params,
        "size_bytes": m.size_bytes,
        "n_embd": m.n_embd,
        "n_layer": m.n_layer,
        "n_vocab": m.n_vocab,
        "n_ctx_train": m.n_ctx_train,
        "recurrent": m.is_recurrent,
        "hybrid": m.is_hybrid,
        "chat_template": _template_summary(m),
        "metadata": meta,
    }


def _template_summary(m: _core.Model) -> str:
    src = m.metadata.get("tokenizer.chat_template")
    if not src:
        return "none (chat uses ChatML)"
    try:
        from ..openai.chat import ChatTemplate

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
    from .. import _logging

    _logging.set_verbose(a.verbose)
    out: dict[str, Any] = {
        "backends": backends(),
        "backend_modules": _core.backend_load_report(),
        "dynamic_backends": _core.dynamic_backends(),
        "rpc": _core.rpc_available(),
        "system_info": _core.system_info().strip(),
    }
    target = draft = None
    try:
        if a.model:
            target = _core.Model.load(a.model, _core.ModelParams(), "target")
            out["target"] = _model_summary(target)
            out["target"]["rollback"] = target.rollback_for_drafting()
            out["target"]["mtp_layers"] = target.n_layer_nextn  # > 0: --spec-type draft-mtp drafts with them
        if a.draft:
            draft = _core.Model.load_drafter(a.draft, _core.ModelParams())
            out["drafter"] = _model_summary(draft)
            out["drafter"]["kind"] = draft.drafter_description  # "dflash2 (selector top-k 4)", ...
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
    print(
        "backends: "
        + ", ".join(
            f"{b['name']} ({b['description']}; {b['type']}, {b['memory_total'] / 2**30:.1f} GiB)"
            for b in out["backends"]
        )
    )
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
            for k in (
                "architecture",
                "kind",
                "description",
                "n_params",
                "size_bytes",
                "n_embd",
                "n_layer",
                "n_vocab",
                "n_ctx_train",
                "recurrent",
                "hybrid",
                "rollback",
                "mtp_layers",
                "chat_template",
            ):
                if k in s:
                    print(f"  {k:<13} {s[k]}{_ROLLBACK_NOTES.get(s[k], '') if k == 'rollback' else ''}")
            for k, v in sorted(s["metadata"].items()):
                v = str(v)
                print(f"  {k} = " + (v if len(v) <= 120 and "\n" not in v else repr(v[:100]) + f"... ({len(v)} chars)"))
    if "compatible" in out:
        print("\ndrafter fits target: " + ("yes" if out["compatible"] else "NO - " + out["incompatibility"]))
        return 0 if out["compatible"] else 1
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
    a = build_parser().parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # the exact command, for the bench's JSON
    # llama.cpp's own log is printed by -v as llama.cpp prints it (pydflash._logging), not twice
    shown = logging.StreamHandler()
    shown.addFilter(lambda r: not r.name.startswith("pydflash.llama_cpp"))
    logging.basicConfig(
        level=logging.INFO if getattr(a, "verbose", False) else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[shown],
    )
    try:
        return {
            "generate": _cmd_generate,
            "demo": demo_command.run,
            "bench": bench_command.run,
            "serve": cmd_serve,
            "info": _cmd_info,
            "rpc-server": _cmd_rpc_server,
            "train-drafter": train_command.run,
        }[a.command](a)
    except (PyDFlashError, ValueError, TypeError, OSError) as e:  # OSError: a file named by a flag
        print(f"pydflash: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
