"""Every per-request generation option, declared once: its type, its default (the
core's, read from ``_core``; never restated), where its rule lives, and its name in
each API that offers it. An API that does not offer an option says so here (its
name is None): it refuses the option by name, it never drops it.

The APIs (``APIS``):

- ``generate``: ``Llama.generate`` / ``stream`` / ``submit`` / ``generate_batch`` keywords;
- ``llama_cpp``: llama-cpp-python's keywords of ``Llama.create_completion`` (and
  ``__call__``; ``create_chat_completion`` takes the same, ``logprobs`` as a bool
  and ``top_logprobs`` as the count, as OpenAI's chat);
- ``completions``, ``chat``: the server's ``POST /v1/completions`` and
  ``/v1/chat/completions`` bodies (OpenAI's fields plus llama-server's);
- ``native``: llama-server's ``POST /completion`` (and ``/infill``);
- ``anthropic``: ``POST /v1/messages``; ``responses``: ``POST /v1/responses``
  (llama-server's extension fields pass through both to the chat request);
- ``cli``: ``pydflash generate``'s flags; ``serve``: ``pydflash serve``'s request
  defaults (a request's own field overrides them).

The C++ ``SamplingParams`` / ``DraftControl`` stay the one validator: ``rule`` says
which struct's ``validate()`` (or which Python check) judges a value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from . import _core

__all__ = ["APIS", "LLAMA_CPP_DEFAULTS", "OPTIONS", "Option", "honoured", "option", "refused"]

APIS = ("generate", "llama_cpp", "completions", "chat", "native", "anthropic", "responses", "cli", "serve")

_SAMPLING = _core.SamplingParams()
_DRAFT = _core.DraftControl()


@dataclasses.dataclass(frozen=True)
class LlamaCppDefaults:
    """llama.cpp's sampling defaults (``common_params_sampling``), which llama-server's
    ``/completion`` and llama-cpp-python's ``create_completion`` use where pydflash's
    own (the core's: greedy) would change what a client of those APIs gets."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05


LLAMA_CPP_DEFAULTS = LlamaCppDefaults()


@dataclasses.dataclass(frozen=True)
class Option:
    """One option: ``name`` is ``SamplingConfig``'s field (``generate``'s keyword),
    ``type`` its Python type as ``generate`` takes it (``SamplingConfig`` checks the plain ones,
    "int", "float" and "bool", by it), ``default`` the core's (None:
    the option has no core default, see ``rule``), ``rule`` where its values are
    judged, ``names`` its name in each of ``APIS`` (None: refused there, by name),
    ``aliases`` the other names an API reads for it (llama-server's), first given wins,
    ``json`` its type in a server request's JSON body (the server's fields are made from it)."""

    name: str
    type: str
    default: object
    rule: str
    names: Mapping[str, str | None]
    aliases: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    json: Any = None

    def __post_init__(self) -> None:
        if set(self.names) != set(APIS):
            missing = sorted(set(APIS) - set(self.names))
            extra = sorted(set(self.names) - set(APIS))
            raise ValueError(f"option {self.name}: each API names it or refuses it (missing {missing}, extra {extra})")

    def name_in(self, api: str) -> str | None:
        """The option's name in ``api`` (a CLI flag for ``cli``/``serve``); None: refused there."""
        return self.names[api]


def _opt(
    name: str,
    type_: str,
    default: object,
    rule: str,
    *,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
    json: Any = None,
    **names: str | None,
) -> Option:
    """An option whose name is ``name`` in every API it does not name otherwise (its JSON
    type: ``type_`` where that is a plain type)."""
    same = {"generate", "llama_cpp", "completions", "chat", "native", "anthropic", "responses"}
    full = {api: names.get(api, name if api in same else None) for api in APIS}
    plain = {"int": int, "float": float, "bool": bool}
    return Option(name, type_, default, rule, full, dict(aliases or {}), plain.get(type_) if json is None else json)


_BUDGET = ("n_predict", "max_completion_tokens", "max_tokens")  # llama-server reads them in this order
_SP = "SamplingParams.validate"
_DC = "DraftControl.validate"

# fmt: off
OPTIONS: tuple[Option, ...] = (
    _opt("max_tokens", "int | None", None, "SamplingConfig (>= 0; None: until the context is full); the "
         "server's budget(): [-1, INT32_MAX]", native="n_predict", responses="max_output_tokens", cli="-n",
         serve="-n", aliases={"completions": _BUDGET, "chat": _BUDGET, "native": _BUDGET}, json=int),
    _opt("temperature", "float", _SAMPLING.temperature, _SP, cli="--temp", serve="--temp"),
    _opt("top_k", "int", _SAMPLING.top_k, _SP, cli="--top-k", serve="--top-k"),
    _opt("top_p", "float", _SAMPLING.top_p, _SP, cli="--top-p", serve="--top-p"),
    _opt("min_p", "float", _SAMPLING.min_p, _SP, cli="--min-p", serve="--min-p"),
    _opt("typical_p", "float", _SAMPLING.typical_p, _SP, cli="--typical"),
    _opt("top_n_sigma", "float", _SAMPLING.top_n_sigma, _SP, cli="--top-nsigma"),
    _opt("repeat_penalty", "float", _SAMPLING.repeat_penalty, _SP, cli="--repeat-penalty"),
    _opt("frequency_penalty", "float", _SAMPLING.frequency_penalty, _SP, cli="--frequency-penalty"),
    _opt("presence_penalty", "float", _SAMPLING.presence_penalty, _SP, cli="--presence-penalty"),
    # llama.cpp's repeat_last_n (-1: the context) on every llama-server endpoint; a pydflash
    # keyword of the llama-cpp-python completions (which set it per model: last_n_tokens_size)
    _opt("penalty_last_n", "int", _SAMPLING.penalty_last_n, _SP + " (-1 on the server and CLI: the context)",
         completions="repeat_last_n", chat="repeat_last_n", native="repeat_last_n",
         anthropic="repeat_last_n", responses="repeat_last_n", cli="--repeat-last-n"),
    _opt("logit_bias", "Mapping[int, float] | None", None, "SamplingConfig (token ids against the vocabulary)",
         json=dict[str, float]),
    _opt("seed", "int | None", None, "SamplingConfig (64 bits; None or < 0 on the server: random)", cli="--seed",
         serve="--seed", json=int),
    _opt("stop", "str | Sequence[str] | None", None, "the server's check_common (MAX_STOP)",
         anthropic="stop_sequences"),
    _opt("ignore_eos", "bool", False, "SamplingConfig", cli="--ignore-eos"),
    _opt("verify", "str | None", None, _SP + " (CHOICES['verify']; None: by seed, SamplingConfig.for_seed)",
         json=str),
    _opt("draft_max", "int | None", None, _DC + " (None: the Llama's; >= 0 pins it)", native="speculative.n_max",
         cli="--draft-max", serve="--draft-max", json=int),
    _opt("draft_min", "int", _DRAFT.draft_min, _DC, native="speculative.n_min", cli="--draft-min",
         serve="--spec-draft-n-min"),
    _opt("draft_p_min", "float", _DRAFT.draft_p_min, _DC, native="speculative.p_min", cli="--draft-p-min",
         serve="--spec-draft-p-min"),
    _opt("cache_prompt", "bool", True, "SamplingConfig"),
    # an int N on the completions (logprobs and N top tokens), a bool on the chat
    _opt("logprobs", "bool", _SAMPLING.logprobs, _SP, native="n_probs", anthropic=None, responses=None,
         aliases={"completions": ("logprobs", "n_probs")}),
    _opt("top_logprobs", "int", _SAMPLING.top_logprobs, _SP + "; the server's MAX_PROBS", llama_cpp="logprobs",
         completions="logprobs", native="n_probs", anthropic=None, responses=None,
         aliases={"completions": ("logprobs", "n_probs")}),
    _opt("post_sampling_probs", "bool", _SAMPLING.post_sampling_probs, _SP, anthropic=None, responses=None),
    _opt("grammar", "Grammar | str | None", None, "Grammar (the core's grammar_error)", cli="--grammar", json=str),
    _opt("json_schema", "Mapping[str, Any] | str | None", None, "Grammar.from_json_schema", json=dict[str, Any],
         cli="--json-schema"),
)
# fmt: on

_BY_NAME = {o.name: o for o in OPTIONS}


def option(name: str) -> Option:
    """The declaration of ``name`` (SamplingConfig's field name); KeyError for another."""
    return _BY_NAME[name]


def honoured(api: str) -> dict[str, str]:
    """{option: its name in ``api``} for the options ``api`` offers."""
    return {o.name: n for o in OPTIONS if (n := o.names[api]) is not None}


def refused(api: str) -> tuple[str, ...]:
    """The options ``api`` refuses by name (their ``generate`` names)."""
    return tuple(o.name for o in OPTIONS if o.names[api] is None)
