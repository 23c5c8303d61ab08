"""Every option of the declaration (pydflash.options), through every API it names
(issue #61): honoured, where two values give different outputs on the shipped pair
(text, finish reason, drafted or cached tokens, log-probabilities), or refused with
an error that names it. Never silently dropped. The server APIs run on a real server
on 127.0.0.1 (this process, the embedded pair); the CLI runs `pydflash generate` in
this process; `pydflash serve`'s request defaults run on a server started with them."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from pydflash import Llama
from pydflash import options as decl
from pydflash.cli.main import build_parser
from pydflash.cli.main import main as cli_main
from pydflash.cli.serve import server_options
from pydflash.config import GenerateOptions, SamplingConfig
from pydflash.server import Server

PROMPT = "def fibonacci(n):\n"
N = 10  # tokens per request
HOT = {"temperature": 1.5, "seed": 3}
ABSENT = object()  # the option left out


@dataclasses.dataclass(frozen=True)
class Probe:
    """Two values of an option (over ``base``) whose ``seen`` output must differ."""

    a: Any
    b: Any
    seen: str = "text"  # text | finish | drafted | cached | logprobs
    base: dict[str, Any] = dataclasses.field(default_factory=dict)


PROBES: dict[str, Probe] = {
    "max_tokens": Probe(2, 8),
    "temperature": Probe(0.0, 1.5, base={"seed": 3}),
    "top_k": Probe(1, 0, base=HOT),
    "top_p": Probe(0.01, 1.0, base=HOT),
    "min_p": Probe(0.9, 0.0, base=HOT),
    "typical_p": Probe(0.01, 1.0, base=HOT),
    "top_n_sigma": Probe(0.5, -1.0, base=HOT),
    "repeat_penalty": Probe(2.0, 1.0),
    "frequency_penalty": Probe(2.0, 0.0),
    "presence_penalty": Probe(2.0, 0.0),
    "penalty_last_n": Probe(0, 64, base={"repeat_penalty": 2.0}),
    "logit_bias": Probe({100: 100.0}, ABSENT),
    "seed": Probe(3, 4, base={"temperature": 1.5}),
    "stop": Probe(["_c", ">"], ABSENT),  # in the completion, in the chat reply
    "ignore_eos": Probe(True, False, "finish", base={"grammar": 'root ::= "ab"'}),
    "verify": Probe("coupled", "rejection", base=HOT),
    "draft_max": Probe(0, 4, "drafted"),
    "draft_min": Probe(8, 0, "drafted", base={"draft_max": 4}),
    "draft_p_min": Probe(1.0, 0.0, "drafted", base={"draft_max": 4}),
    "cache_prompt": Probe(False, True, "cached"),
    "logprobs": Probe(True, False, "logprobs"),
    "top_logprobs": Probe(1, 3, "logprobs", base={"logprobs": True}),
    "post_sampling_probs": Probe(
        True, False, "logprobs", base={**HOT, "top_k": 1, "logprobs": True, "top_logprobs": 1}
    ),
    "grammar": Probe('root ::= "ab"', ABSENT),
    "json_schema": Probe({"enum": ["yes"]}, ABSENT),
}

# what a refusal sends, per option (a value that would change the output if it were read)
REFUSAL_VALUES = {name: p.a if p.a is not ABSENT else p.b for name, p in PROBES.items()}


@dataclasses.dataclass(frozen=True)
class Out:
    """What a probe may look at."""

    text: str
    finish: str
    drafted: int | None = None
    cached: int | None = None
    logprobs: tuple[float, int] | None = None  # the first token's (logprob, number of top tokens)


class Refused(Exception):
    """An API's refusal: its message."""


# -- the declaration itself -----------------------------------------------------


def test_the_declaration_covers_every_sampling_option():
    names = [o.name for o in decl.OPTIONS]
    assert len(names) == len(set(names))
    fields = {f.name for f in dataclasses.fields(SamplingConfig)}
    # SamplingConfig's fields and its build() keyword, generate()'s keywords: each declared once
    assert fields | {"json_schema"} == set(names)
    # generate()'s keywords are the declared names, no more, no less
    params = set(inspect.signature(Llama.generate).parameters) - {"self", "prompt", "options"}
    assert params | set(GenerateOptions.__annotations__) == set(decl.honoured("generate").values())
    for other in (Llama.stream, Llama.submit, Llama.generate_batch):  # the same keywords (the probes use generate)
        assert set(inspect.signature(other).parameters) - {"self", "prompt", "prompts", "options", "slot"} == params
    assert set(PROBES) == set(names), "every declared option needs a probe here"
    for o in decl.OPTIONS:
        assert set(o.names) == set(decl.APIS)


def test_the_defaults_are_the_cores():
    d = SamplingConfig()
    for o in decl.OPTIONS:
        if o.default is not None:
            assert getattr(d, o.name) == o.default, o.name


def test_an_api_left_out_is_a_mistake():
    with pytest.raises(ValueError, match="each API names it or refuses it"):
        decl.Option("x", "int", 0, "", {"generate": "x"})


# -- the APIs -------------------------------------------------------------------


def _logprob_sig(logprob: float, n_top: int) -> tuple[float, int]:
    return round(logprob, 3), n_top


def _with_defaults(kw: dict[str, Any]) -> dict[str, Any]:
    """A probe's options over greedy N-token requests (every API's own default aside)."""
    return {"max_tokens": N, "temperature": 0.0, **kw}


def run_generate(llm: Llama, kw: dict[str, Any]) -> Out:
    r = llm.generate(PROMPT, **kw)
    lp = _logprob_sig(r.logprobs[0].logprob, len(r.logprobs[0].top)) if r.logprobs else None
    return Out(r.text, r.finish_reason, r.stats.n_drafted, r.stats.cached_tokens, lp)


def _wire(kw: dict[str, Any], api: str, int_logprobs: bool = False) -> dict[str, Any]:
    """The options under ``api``'s names; ``int_logprobs``: logprobs/top_logprobs as one
    count N (the completions' logprobs, llama-server's n_probs)."""
    kw, extra = dict(kw), {}
    if int_logprobs:
        on, top = kw.pop("logprobs", False), kw.pop("top_logprobs", None)
        if on:
            extra[decl.option("top_logprobs").names[api]] = 1 if top is None else top
    return {**_renamed(kw, api), **extra}


def _completion_logprobs(lps: dict[str, Any] | None) -> tuple[float, int] | None:
    if not lps:
        return None
    return _logprob_sig(lps["token_logprobs"][0], len(lps["top_logprobs"][0]))


def run_llama_cpp(llm: Llama, kw: dict[str, Any]) -> Out:
    kw = _wire(kw, "llama_cpp", int_logprobs=True)
    r = llm.create_completion(PROMPT, **kw)
    choice = r["choices"][0]
    drafted = r["timings"]["draft_n"]
    return Out(choice["text"], choice["finish_reason"], drafted, r["timings"]["cache_n"],
               _completion_logprobs(choice["logprobs"]))


def _renamed(kw: dict[str, Any], api: str) -> dict[str, Any]:
    """The options under ``api``'s names (a refused one raises: a probe never sends one)."""
    out = {}
    for name, value in kw.items():
        wire = decl.option(name).names[api]
        if wire is None:
            raise Refused(f"{name} (declared refused by {api})")
        out[wire] = value
    return out


def _json_values(kw: dict[str, Any]) -> dict[str, Any]:
    out = dict(kw)
    if "logit_bias" in out:
        out["logit_bias"] = {str(t): b for t, b in out["logit_bias"].items()}
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


def post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        err = json.loads(e.read())
        raise Refused(f"{e.code} {json.dumps(err)}") from None


def server_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _counter(m: dict[str, float], suffix: str) -> float:
    return next(v for k, v in sorted(m.items()) if k.endswith(suffix) and "{" not in k)


MESSAGES = [{"role": "user", "content": PROMPT}]


def _body(api: str, kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    names = "completions" if api == "serve" else api
    kw = _json_values(_wire(kw, names, int_logprobs=names in ("completions", "native")))
    if api in ("completions", "serve"):
        return "/v1/completions", {"prompt": PROMPT, **kw}
    if api == "native":
        return "/completion", {"prompt": PROMPT, **kw}
    if api == "chat":
        return "/v1/chat/completions", {"messages": MESSAGES, **kw}
    if api == "anthropic":
        return "/v1/messages", {"messages": MESSAGES, **kw}
    return "/v1/responses", {"input": PROMPT, **kw}


def _reply(api: str, r: dict[str, Any]) -> tuple[str, str, tuple[float, int] | None]:
    """(text, finish, logprobs) of a reply."""
    if api in ("completions", "serve"):
        c = r["choices"][0]
        return c["text"], c["finish_reason"], _completion_logprobs(c["logprobs"])
    if api == "chat":
        c = r["choices"][0]
        content = (c.get("logprobs") or {}).get("content") or []
        lp = _logprob_sig(content[0]["logprob"], len(content[0]["top_logprobs"])) if content else None
        return c["message"]["content"] or "", c["finish_reason"], lp
    if api == "native":
        probs = r.get("completion_probabilities") or []
        lp = None
        if probs:
            first = probs[0]
            v = first["logprob"] if "logprob" in first else math.log(max(first["prob"], 1e-30))
            lp = _logprob_sig(v, len(first.get("top_logprobs", first.get("top_probs", []))))
        return r["content"], r["stop_type"], lp
    if api == "anthropic":
        return "".join(b.get("text", "") for b in r["content"]), r["stop_reason"], None
    text = "".join(p.get("text", "") for item in r["output"] if item["type"] == "message" for p in item["content"])
    return text, r["status"], None


def run_server(url: str, api: str, kw: dict[str, Any]) -> Out:
    path, body = _body(api, kw)
    before = server_metrics(url)
    r = post(url, path, body)
    after = server_metrics(url)
    text, finish, lp = _reply(api, r)
    drafted = _counter(after, "draft_tokens_total") - _counter(before, "draft_tokens_total")
    cached = _counter(after, "prompt_tokens_cached_total") - _counter(before, "prompt_tokens_cached_total")
    return Out(text, finish, int(drafted), int(cached), lp)


def _flags(api: str, kw: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for name, value in kw.items():
        flag = decl.option(name).names[api]
        if flag is None:
            raise Refused(f"{name} (declared refused by {api})")
        if value is True:
            argv.append(flag)
        elif value is not False:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def run_cli(capsys: pytest.CaptureFixture[str], kw: dict[str, Any]) -> Out:
    capsys.readouterr()
    rc = cli_main(["generate", "-p", PROMPT, "--json", "-t", "1", "-c", "256", *_flags("cli", kw)])
    out = capsys.readouterr().out
    assert rc == 0, out
    r = json.loads(out)
    return Out(r["text"], r["finish_reason"], r["stats"]["n_drafted"])


@contextlib.contextmanager
def serve_with(llm: Llama, kw: dict[str, Any]) -> Iterator[str]:
    """A server on ``llm`` with `pydflash serve`'s request defaults from the flags for ``kw``."""
    a = build_parser().parse_args(["serve", *_flags("serve", kw)])
    srv = Server(llm, port=0, metrics=True, defaults=server_options(a)["defaults"]).start()
    try:
        yield srv.url
    finally:
        srv.shutdown()


SERVER_APIS = ("completions", "chat", "native", "anthropic", "responses")


@pytest.fixture(scope="module")
def server(embedded_dflash: Llama) -> Iterator[str]:
    srv = Server(embedded_dflash, port=0, metrics=True).start()
    yield srv.url
    srv.shutdown()


def _cases(honoured: bool) -> list[Any]:
    return [
        pytest.param(api, o.name, id=f"{api}-{o.name}")
        for api in decl.APIS
        for o in decl.OPTIONS
        if (o.names[api] is not None) == honoured
    ]


def _run(api: str, kw: dict[str, Any], llm: Llama, url: str, capsys: pytest.CaptureFixture[str]) -> Out:
    kw = {k: v for k, v in _with_defaults(kw).items() if v is not ABSENT}
    if api == "generate":
        return run_generate(llm, kw)
    if api == "llama_cpp":
        return run_llama_cpp(llm, kw)
    if api == "cli":
        return run_cli(capsys, kw)
    if api == "serve":
        with serve_with(llm, kw) as own:
            return run_server(own, api, {})
    return run_server(url, api, kw)


@pytest.mark.parametrize(("api", "name"), _cases(honoured=True))
def test_an_offered_option_changes_the_output(api, name, embedded_dflash, server, capsys):
    probe = PROBES[name]
    seen = []
    for value in (probe.a, probe.a, probe.b):  # a twice: an option dropped to a random default differs too
        kw = {**probe.base, name: value}
        if probe.seen == "cached":  # the prompt in the caches first
            _run(api, {**probe.base}, embedded_dflash, server, capsys)
        out = _run(api, kw, embedded_dflash, server, capsys)
        seen.append(getattr(out, probe.seen))
    assert seen[0] is not None, f"{api} does not show {probe.seen}"
    assert seen[0] == seen[1], f"{api}: {name}={probe.a!r} is not deterministic: {seen[0]!r}, {seen[1]!r}"
    assert seen[0] != seen[2], f"{api}: {name}={probe.a!r} and {probe.b!r} gave the same {probe.seen}: {seen[0]!r}"


def _refusal(api: str, name: str, llm: Llama, url: str) -> str:
    """The message of ``api``'s refusal of ``name`` (sent under its generate() name / flag)."""
    value = REFUSAL_VALUES[name]
    if api in ("cli", "serve"):
        flag = decl.option(name).names["cli"] or "--" + name.replace("_", "-")
        argv = [flag] if value is True else [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
        with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err := _Buffer()):
            a = build_parser().parse_args([api if api == "serve" else "generate", *argv])
            server_options(a) if api == "serve" else None
        assert e.value.code == 2
        return err.text
    if api in ("generate", "llama_cpp"):
        with pytest.raises((TypeError, ValueError)) as exc:
            fn = llm.generate if api == "generate" else llm.create_completion
            fn(PROMPT, max_tokens=2, **{name: value})
        return str(exc.value)
    path, body = _body(api, {})
    body[name] = _json_values({name: value})[name]
    with pytest.raises(Refused) as refused:
        post(url, path, body)
    assert refused.value.args[0].startswith("400 ")
    return refused.value.args[0]


class _Buffer:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("api", "name"), _cases(honoured=False))
def test_an_option_not_offered_is_refused_by_name(api, name, embedded_dflash, server):
    message = _refusal(api, name, embedded_dflash, server)
    spelled = decl.option(name).names["cli"] or "--" + name.replace("_", "-") if api in ("cli", "serve") else name
    assert spelled in message, message


def test_every_api_refuses_what_it_does_not_declare():
    """The table is the decision: these are the options each API refuses today."""
    assert decl.refused("generate") == ()
    assert decl.refused("llama_cpp") == ()
    assert decl.refused("completions") == decl.refused("chat") == decl.refused("native") == ()
    assert decl.refused("anthropic") == decl.refused("responses") == ("logprobs", "top_logprobs", "post_sampling_probs")


def test_the_openai_endpoints_share_their_option_fields():
    """/v1/completions and /v1/chat/completions take one set of fields made from the "chat"
    column: the completions' names are the same, but for the log-probabilities' count."""
    differ = {"logprobs", "top_logprobs"}
    completions = {k: v for k, v in decl.honoured("completions").items() if k not in differ}
    assert completions == {k: v for k, v in decl.honoured("chat").items() if k not in differ}


def test_a_request_field_is_made_for_every_declared_name():
    from pydflash.server.native import NativeRequest
    from pydflash.server.requests import ChatRequest, CompletionRequest

    for api, model in (("completions", CompletionRequest), ("chat", ChatRequest), ("native", NativeRequest)):
        names = {f.alias or name for name, f in model.model_fields.items()}
        assert set(decl.honoured(api).values()) <= names, api


@pytest.mark.parametrize("api", ["anthropic", "responses"])
def test_a_refused_option_left_off_is_no_error(api, server):
    path, body = _body(api, _with_defaults({}))
    out = post(server, path, {**body, "logprobs": False, "top_logprobs": 0, "post_sampling_probs": False})
    assert _reply(api, out)[0]


@pytest.mark.parametrize("function", ["create_completion", "create_chat_completion"])
def test_the_completions_take_declared_options_by_name_and_refuse_others(function, embedded_dflash, monkeypatch):
    """The llama-cpp-python completions take a declared option their written-out signature
    lacks by its "llama_cpp" name (``**options``), so a new option needs no keyword there;
    any other name is the TypeError a written-out signature would raise."""
    from pydflash.openai import completions

    arg: Any = PROMPT if function == "create_completion" else [{"role": "user", "content": PROMPT}]
    call = getattr(embedded_dflash, function)
    with pytest.raises(TypeError, match=f"{function}\\(\\) got an unexpected keyword argument 'draft_mni'"):
        call(arg, max_tokens=N, draft_mni=1)
    # draft_min as if the signature did not write it out: passed from **options, by name
    monkeypatch.setattr(completions, "_PLAIN", (*completions._PLAIN, ("draft_min", "spec_draft_min")))
    drafted = [call(arg, max_tokens=N, temperature=0.0, draft_max=4, spec_draft_min=m)["timings"]["draft_n"]
               for m in (0, 8)]
    assert drafted[0] > 0 and drafted[1] == 0
