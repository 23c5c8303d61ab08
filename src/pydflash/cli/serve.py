"""``pydflash serve``: its flags (llama-server's names where pydflash does the same
thing) and the command. A llama-server flag that does not apply is refused by
name, not silently ignored."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..options import OPTIONS
from .common import DRAFT_MAX_HELP, add_common, llama_options

__all__ = ["add_serve", "cmd_serve", "serve_llama_options", "server_options"]

log = logging.getLogger("pydflash.serve")

DESCRIPTION = """\
Serve one target + DFlash drafter pair over HTTP, with llama-server's API under its
names and shapes (a llama-server client works unchanged). Without -m: the embedded
pair. Needs the server extra: pip install pydflash[server].

Supported:
  POST /v1/completions, /completions, /v1/chat/completions, /chat/completions
       (OpenAI; stream: server-sent events; tools; logprobs; response_format)
  POST /completion (llama-server's native completion), /tokenize, /detokenize,
       /apply-template, /chat/completions/input_tokens, /infill (models with FIM tokens)
  POST /v1/messages, /v1/messages/count_tokens (Anthropic; stream, tools, x-api-key)
  POST /v1/responses, /responses, /v1/responses/input_tokens (OpenAI Responses; stateless)
  GET  /props, /v1/models, /models, /health, /v1/health, /slots (--no-slots: off),
       /metrics, /v1/metrics (with --metrics: llamacpp: names + speculative counters)
  POST /slots/ID?action=save|restore|erase (save/restore: --slot-save-path)
  GET  / (a chat page that shows speculative decoding at work; --no-webui: off)
Not supported (501, naming the feature): embeddings, rerank, multimodal input,
  LoRA adapters, the model router, /infill on a model without FIM tokens,
  Responses' previous_response_id (400: nothing is stored).
Safety: --api-key guards every path but /health and the chat page's files; a server on loopback answers
  only Host: localhost/127.0.0.1/[::1]; JSON bodies only (no CORS-simple types);
  a client that reads nothing for --timeout seconds is cut off; SIGTERM drains
  running requests for --shutdown-grace seconds, then ends streams with an error event."""

# llama-server flags that pydflash does not implement: refused with the reason
_REFUSED = {
    "--embedding": "embeddings are not supported",
    "--embeddings": "embeddings are not supported",
    "--reranking": "rerank is not supported",
    "--rerank": "rerank is not supported",
    "--lora": "LoRA adapters are not supported",
    "--lora-scaled": "LoRA adapters are not supported",
    "--mmproj": "multimodal input is not supported",
    "--models-dir": "the model router is not supported (one pair per server)",
    "--models-preset": "the model router is not supported (one pair per server)",
    "-hf": "downloading from a hub is not supported here: give local files with -m and -md",
    "--hf-repo": "downloading from a hub is not supported here: give local files with -m and -md",
    "--context-shift": "context shift is not supported (a prompt over the context is refused)",
}


def add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "serve",
        help="llama-server-compatible HTTP server (OpenAI API, native endpoints, speculative /metrics)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: pydflash serve -m target.gguf -md drafter.gguf --port 8080, then "
        "openai.OpenAI(base_url='http://127.0.0.1:8080/v1', api_key='none')",
    )
    s.add_argument("-m", "--model", metavar="TARGET", help="target GGUF file (default: the embedded pair)")
    s.add_argument(
        "-d",
        "-md",
        "--draft",
        "--model-draft",
        dest="draft",
        metavar="DRAFT",
        help="drafter GGUF file (omit: target alone)",
    )
    s.add_argument(
        "--host",
        action="append",
        default=None,
        help="address to listen on; repeat or comma-separate for several (default: 127.0.0.1)",
    )
    s.add_argument("--port", type=int, default=8080, help="port; 0 = any free port (default: %(default)s)")
    s.add_argument(
        "-a",
        "--alias",
        default=None,
        help="model id(s) reported by /v1/models, comma-separated (default: the file name)",
    )
    s.add_argument("--tags", default="", help="model tags reported by /v1/models, comma-separated")
    s.add_argument(
        "-np",
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="generations the model runs at once; -1: llama-server's auto, 4 sharing one KV cache "
        "(default: %(default)s)",
    )
    _add_serving_flags(s)
    s.add_argument(
        "-kvu",
        "--kv-unified",
        action="store_true",
        help="one KV cache shared by the --parallel sequences: each may use all of -c, and a request "
        "that finds it full fails with every request then running (default: -c / --parallel each)",
    )
    _add_spec_flags(s)
    _add_template_flags(s)
    smp = s.add_argument_group("request defaults (a request's own fields override them)")
    add_common(s)
    # llama.cpp's short names: added here unless the shared flags already have them
    _add_missing(s, ("-c", "--ctx-size"), dest="n_ctx", type=int, help="context size in tokens (as --n-ctx)")
    _add_missing(
        smp,
        ("-n", "--n-predict"),
        dest="max_tokens",
        type=int,
        default=-1,
        help="tokens to generate; -1: until EOS or the context is full (default: %(default)s)",
    )
    temp_help = "temperature (default: the request's API default)"
    _add_missing(smp, ("--temp",), dest="temperature", type=float, default=None, help=temp_help)
    _add_missing(smp, ("--top-k",), dest="top_k", type=int, default=None, help="top-k")
    _add_missing(smp, ("--top-p",), dest="top_p", type=float, default=None, help="top-p")
    _add_missing(smp, ("--min-p",), dest="min_p", type=float, default=None, help="min-p")
    _add_missing(smp, ("-s", "--seed"), dest="seed", type=int, default=None, help="sampling seed (-1: random)")
    for flag in _REFUSED:
        _add_missing(
            s,
            (flag,),
            dest="refused_" + flag.strip("-").replace("-", "_"),
            nargs="?",
            const=True,
            help=argparse.SUPPRESS,
        )


def _add_serving_flags(s: argparse.ArgumentParser) -> None:
    """Queueing, timeouts, slots, metrics, keys and CORS."""
    s.add_argument(
        "--queue-size",
        type=int,
        default=None,
        metavar="N",
        help="requests admitted beyond --parallel, waiting their turn; more get 503 "
        "(default: 4 x parallel, at least 8)",
    )
    s.add_argument(
        "-to",
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="time a client has to send its request body, and to read what the server writes (default: %(default)s)",
    )
    s.add_argument(
        "--shutdown-grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, time running requests get to finish (default: %(default)s)",
    )
    s.add_argument(
        "--sleep-idle-seconds",
        type=int,
        default=-1,
        metavar="SECONDS",
        help="free the model after this many seconds without a request that uses it; the next one reloads "
        "it first (/health, /props, /models and /metrics answer meanwhile without waking it); -1: never "
        "(default: %(default)s)",
    )
    s.add_argument(
        "--max-connections",
        type=int,
        default=256,
        metavar="N",
        help="past this many open connections (or running requests) new requests get 503 (default: %(default)s)",
    )
    s.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="where POST /slots/ID?action=save|restore keeps slot files (default: save and restore off)",
    )
    s.add_argument("--slots", dest="slots", action="store_true", default=True, help="GET /slots answers (default)")
    s.add_argument("--no-slots", dest="slots", action="store_false", help="GET /slots and POST /slots/ID answer 501")
    s.add_argument("--metrics", action="store_true", help="GET /metrics answers (default: off, as llama-server)")
    s.add_argument(
        "--webui", "--ui", dest="webui", action="store_true", default=True, help="the chat page at GET / (default)"
    )
    s.add_argument("--no-webui", "--no-ui", dest="webui", action="store_false", help="no chat page: GET / is a 404")
    s.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="API key(s), comma-separated: every path but /health and the chat page's files needs one",
    )
    s.add_argument("--api-key-file", default=None, metavar="FILE", help="a file of API keys, one per line")
    s.add_argument(
        "--cors-origins",
        default="*",
        metavar="ORIGINS",
        help="origins a browser may call from: *, localhost, or a comma-separated list (default: %(default)s)",
    )


def _add_spec_flags(s: argparse.ArgumentParser) -> None:
    spec = s.add_argument_group("speculative decoding (llama-server's names)")
    spec.add_argument(
        "--draft-max", "--spec-draft-n-max", dest="draft_max", type=int, default=None, help=DRAFT_MAX_HELP
    )
    spec.add_argument(
        "--spec-draft-n-min",
        dest="draft_min",
        type=int,
        default=None,
        metavar="N",
        help="drafts shorter than N are dropped",
    )
    spec.add_argument(
        "--spec-draft-p-min",
        dest="draft_p_min",
        type=float,
        default=None,
        metavar="P",
        help="a draft stops at the first token the drafter is less sure of than P",
    )


def _add_template_flags(s: argparse.ArgumentParser) -> None:
    tmpl = s.add_argument_group("chat template")
    tmpl.add_argument(
        "--chat-template",
        default=None,
        metavar="TEMPLATE",
        help="jinja source or a llama.cpp built-in name (default: the GGUF's own template, ChatML if it has none)",
    )
    tmpl.add_argument("--chat-template-file", default=None, metavar="FILE", help="a file holding the jinja template")
    tmpl.add_argument("--jinja", action="store_true", help="accepted: templates are always rendered with jinja")
    tmpl.add_argument(
        "-rea",
        "--reasoning",
        choices=("on", "off", "auto"),
        default="auto",
        help="thinking in chat replies of templates that have it: on, off, or auto (the template's default; "
        "a request's enable_thinking overrides it) (default: %(default)s)",
    )
    tmpl.add_argument(
        "--no-jinja",
        action="store_true",
        help="as llama-server's: the chat template renders the messages only; a JSON schema or grammar "
        "constrains the reply as it is (not framed in the template's reply format), the reply is all "
        "content, and tools are refused",
    )


def _add_missing(p: argparse._ActionsContainer, flags: tuple[str, ...], **kw: Any) -> None:
    """Add the flags that no other option of the parser has taken (argparse has no public query)."""
    free = [f for f in flags if f not in p._option_string_actions]
    if free:
        p.add_argument(*free, **kw)


def server_options(a: argparse.Namespace) -> dict[str, Any]:
    """``Server``'s keyword arguments from the flags (ValueError for one that does not apply)."""
    for flag, why in _REFUSED.items():
        if getattr(a, "refused_" + flag.strip("-").replace("-", "_"), None) is not None:
            raise ValueError(f"{flag}: {why}")
    keys = [k.strip() for k in (a.api_key or "").split(",") if k.strip()]
    if a.api_key_file:
        keys += [line.strip() for line in Path(a.api_key_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    hosts = [h.strip() for arg in (a.host or ["127.0.0.1"]) for h in arg.split(",") if h.strip()]
    # the options the declaration (options.py) gives `pydflash serve` flags for, by their dests
    # (each the option's name): llama.cpp's -n -1 is no limit, a negative --temp greedy, a
    # --top-k below 1 off
    given: dict[str, Any] = {o.name: getattr(a, o.name, None) for o in OPTIONS if o.names["serve"] is not None}
    if given.get("max_tokens") is not None and given["max_tokens"] < 0:
        given["max_tokens"] = None
    for name, floor in (("temperature", 0.0), ("top_k", 0)):
        value = given.get(name)
        if value is not None:
            given[name] = max(value, floor)
    given["enable_thinking"] = {"on": True, "off": False}.get(a.reasoning)
    given["jinja"] = False if a.no_jinja else None
    defaults = {k: v for k, v in given.items() if v is not None}
    return {
        "host": hosts,
        "port": a.port,
        "alias": a.alias,
        "queue_size": a.queue_size,
        "timeout": a.timeout,
        "max_connections": a.max_connections,
        "slot_save_path": a.slot_save_path,
        "api_keys": keys,
        "webui": a.webui,
        "cors_origins": a.cors_origins,
        "metrics": a.metrics,
        "slots": a.slots,
        "shutdown_grace": a.shutdown_grace,
        "sleep_idle_seconds": a.sleep_idle_seconds if a.sleep_idle_seconds > 0 else None,
        "defaults": defaults,
        "tags": [t for t in a.tags.split(",") if t.strip()],
    }


def serve_llama_options(a: argparse.Namespace) -> dict[str, Any]:
    """``Llama``'s keyword options from the flags, ``n_parallel`` and ``kv_unified`` included:
    ``-np -1`` is llama-server's auto (4 sequences sharing one KV cache)."""
    if a.parallel == 0:
        raise ValueError("--parallel must be >= 1, or -1 (auto), got 0")
    auto = a.parallel < 0
    return dict(llama_options(a), n_parallel=4 if auto else a.parallel, kv_unified=a.kv_unified or auto)


def chat_template(a: argparse.Namespace) -> str | None:
    """The template source from --chat-template / --chat-template-file."""
    if a.chat_template_file is not None:
        path = Path(a.chat_template_file)
        if not path.is_file():
            raise ValueError(f"--chat-template-file: no such file: {a.chat_template_file}")
        return path.read_text(encoding="utf-8")
    template: str | None = a.chat_template
    if template and Path(template).is_file():  # a file given as --chat-template, as before
        template = Path(template).read_text(encoding="utf-8")
    return template


def cmd_serve(a: argparse.Namespace) -> int:
    try:
        from ..server.app import Server, serve
    except ImportError as e:  # the server extra is not installed: the message says what to install
        print(f"pydflash: error: {e}", file=sys.stderr)
        return 2
    options = server_options(a)
    template = chat_template(a)
    model, draft = a.model, a.draft
    if model is None:
        from ..embedded import embedded_pair

        model, default_draft = embedded_pair()
        draft = draft or default_draft

    def ready(srv: Server) -> None:
        print(f"pydflash: serving {srv.alias} on {srv.url} (OpenAI API at {srv.url}/v1)", file=sys.stderr, flush=True)

    llama = serve_llama_options(a)
    serve(
        model,
        draft,
        parallel=llama.pop("n_parallel"),
        server=options,
        ready=ready,
        chat_template=template,
        **llama,
    )
    return 0
