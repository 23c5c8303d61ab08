"""Typed, validated option sets, built once per call from keyword arguments."""

from __future__ import annotations

import dataclasses
import json
import operator
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, SupportsIndex, TypedDict

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover
    from typing_extensions import Unpack

from . import _core
from .options import OPTIONS

# The core owns every option's choices, defaults and value rules; this module
# only converts Python values (types, None/bool conveniences) and asks the core.
CHOICES: Mapping[str, tuple[str, ...]] = _core.CHOICES
ROLLBACK_KINDS = CHOICES["rollback"]
SPLIT_MODES = CHOICES["split_mode"]
FLASH_ATTN = CHOICES["flash_attn"]
CACHE_TYPES = CHOICES["cache_type"]  # llama.cpp's KV cache types (its --cache-type-k/-v names)
VERIFY_MODES = CHOICES["verify"]

_PAIR = _core.PairParams()
_NGRAM = _core.NgramParams()
_MODEL = _core.ModelParams()
SPEC_TYPES: tuple[str, ...] = _core.SPECULATIVE_TYPES  # llama.cpp's --spec-type names
_SAMPLING = _core.SamplingParams()


def int_option(name: str, value: object, minimum: int | None = None, bits: int = 32) -> int:
    """An int (not a bool) that fits the core's field (`bits` wide); `minimum`
    only for the options this layer owns (the core checks its own)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    if not isinstance(value, SupportsIndex):  # int, numpy integers: anything with __index__
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    v = operator.index(value)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if not -(2 ** (bits - 1)) <= v < 2 ** (bits - 1):
        raise ValueError(f"{name} must fit in {bits} bits, got {v}")
    return v


def float_option(name: str, value: object) -> float:
    """A number (not a bool) as a float; TypeError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    return float(value)


def str_option(name: str, value: object) -> str:
    """``value`` when it is a str; TypeError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return value


@dataclasses.dataclass(frozen=True)
class NgramConfig:
    """llama.cpp's n-gram drafters' settings (its ``--spec-ngram-*`` options, with
    its defaults), for the n-gram types listed in ``speculative``."""

    mod_n_match: int = _NGRAM.mod_n_match  # ngram-mod: tokens matched to look up a draft
    mod_n_min: int = _NGRAM.mod_n_min  # ngram-mod: a shorter draft is dropped
    mod_n_max: int = _NGRAM.mod_n_max  # ngram-mod: longest draft
    simple_size_n: int = _NGRAM.simple_size_n  # ngram-simple: lookup length
    simple_size_m: int = _NGRAM.simple_size_m  # ngram-simple: draft length
    map_k_size_n: int = _NGRAM.map_k_size_n
    map_k_size_m: int = _NGRAM.map_k_size_m
    map_k_min_hits: int = _NGRAM.map_k_min_hits
    map_k4v_size_n: int = _NGRAM.map_k4v_size_n
    map_k4v_size_m: int = _NGRAM.map_k4v_size_m
    map_k4v_min_hits: int = _NGRAM.map_k4v_min_hits

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            int_option(f.name, getattr(self, f.name))
        self.core().validate()

    def core(self) -> _core.NgramParams:
        """These settings as the core's ``NgramParams``."""
        return _core.NgramParams(**dataclasses.asdict(self))


def speculative_types(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """llama.cpp's --spec-type list: a sequence of names or one comma-separated
    string ("ngram-mod,draft-dflash"); None: the drafter alone, if any."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [x.strip() for x in value.split(",") if x.strip()]
    elif not isinstance(value, Sequence):
        raise TypeError(f"speculative must be a list of llama.cpp's --spec-type names, not {type(value).__name__}")
    for x in value:
        if not isinstance(x, str):
            raise TypeError(f"speculative entries must be str, not {type(x).__name__}")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """How the pair is loaded, where its layers go and how its contexts are
    sized. Device options apply where a GPU or RPC backend exists; on a CPU-only
    build the layers stay on the CPU. Defaults are the core's."""

    # all sequences together: each gets n_ctx // n_parallel (llama.cpp's -c); 0: the model's
    # training context, read when it loads (llama.cpp's -c 0, llama-cpp-python's n_ctx=0)
    n_ctx: int = _PAIR.n_ctx
    n_parallel: int = _PAIR.n_seq  # sequences decoded together (llama.cpp's -np)
    # llama.cpp's --kv-unified: each sequence may fill all n_ctx cells, shared; when they
    # run out, the decode fails every sequence in it ("the context size has been exceeded")
    kv_unified: bool = False
    offload_kqv: bool = _PAIR.offload_kqv  # KV caches on the layers' GPU (False: llama.cpp's -nkvo)
    n_batch: int = _PAIR.n_batch
    n_ubatch: int | None = None  # the physical batch; None: min(n_batch, the core's)
    # target layers to offload; -1: all (the CUDA build's default: a GPU is why it was built)
    n_gpu_layers: int = -1 if _core.dynamic_backends() else _MODEL.n_gpu_layers
    draft_n_gpu_layers: int | None = None  # the drafter's; None: as n_gpu_layers
    main_gpu: int = _MODEL.main_gpu  # the device used with split_mode "none"; -1: none (the CPU)
    split_mode: str = _MODEL.split_mode  # across several GPUs: "none", "layer" or "row"
    tensor_split: tuple[float, ...] = ()  # share of the model per device; (): by free memory
    rpc_servers: tuple[str, ...] = ()  # "host:port" of ggml RPC servers (offload targets)
    flash_attn: str = _PAIR.flash_attn  # "auto", "on" or "off" (True/False accepted), both contexts
    type_k: str = _PAIR.type_k  # the target's KV cache types
    type_v: str = _PAIR.type_v
    draft_type_k: str = _PAIR.draft_type_k  # the drafter's
    draft_type_v: str = _PAIR.draft_type_v
    # the drafter sees (attends to, keeps in its KV cache) the target features of the last
    # draft_window positions only; 0: the whole context; None: the drafter's own sliding
    # window if it has one, else _core.DEFAULT_DRAFT_WINDOW. Never changes the output
    draft_window: int | None = None
    n_threads: int | None = None  # None: all hardware threads
    n_threads_batch: int | None = None  # prompt and batch passes; None: as n_threads
    use_mmap: bool = _MODEL.use_mmap  # map the weights from the file instead of reading them
    use_mlock: bool = _MODEL.use_mlock  # keep the weights in RAM
    rope_freq_base: float = 0.0  # the target's RoPE base; 0: the model's (the drafter keeps its own)
    embedding: bool = False  # also make an embedding context of the target (create_embedding)
    # None: each step's draft length is chosen (draft_adaptive), else block size - 1; an int pins it
    draft_max: int | None = None
    draft_adaptive: bool = True  # False: draft block size - 1 every step when draft_max is None
    seed: int = -1  # -1: a random seed per generation, as llama.cpp
    rollback: str = _PAIR.rollback
    # llama.cpp's --spec-type list, e.g. ("ngram-mod", "draft-dflash"): n-gram drafts
    # first, the drafter's block otherwise; (): the drafter alone, if any
    speculative: tuple[str, ...] = ()
    ngram: NgramConfig = NgramConfig()

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative", speculative_types(self.speculative))
        if not isinstance(self.ngram, NgramConfig):
            raise TypeError(f"ngram must be an NgramConfig, not {type(self.ngram).__name__}")
        for name in ("n_ctx", "n_parallel", "n_batch", "n_gpu_layers", "main_gpu"):
            int_option(name, getattr(self, name))
        for name in ("draft_n_gpu_layers", "n_threads", "n_threads_batch", "n_ubatch"):
            if getattr(self, name) is not None:
                int_option(name, getattr(self, name))
        if self.draft_max is not None:
            int_option("draft_max", self.draft_max, 0)  # None is the default, not -1
        if self.draft_window is not None and int_option("draft_window", self.draft_window) < 0:
            raise ValueError(
                f"draft_window must be >= 0 (0: the whole context, None: the default), got {self.draft_window}"
            )
        if not isinstance(self.draft_adaptive, bool):
            raise TypeError(
                f"draft_adaptive must be a bool (False: a fixed draft length of block size - 1), "
                f"not {type(self.draft_adaptive).__name__}"
            )
        int_option("seed", self.seed, bits=64)
        for name in ("use_mmap", "use_mlock", "embedding", "offload_kqv"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, not {type(getattr(self, name)).__name__}")
        float_option("rope_freq_base", self.rope_freq_base)
        if isinstance(self.tensor_split, (str, bytes)) or not isinstance(self.tensor_split, Sequence):
            raise TypeError(f"tensor_split must be a sequence of numbers, not {type(self.tensor_split).__name__}")
        split = tuple(float_option("tensor_split entry", x) for x in self.tensor_split)
        object.__setattr__(self, "tensor_split", split)
        rpc = self.rpc_servers
        if isinstance(rpc, str):  # llama.cpp's --rpc takes "a:1,b:2"
            rpc = tuple(x for x in rpc.split(",") if x)
        for x in rpc:
            if not isinstance(x, str):
                raise TypeError(f"rpc_servers entries must be 'host:port' strings, not {type(x).__name__}")
        object.__setattr__(self, "rpc_servers", tuple(rpc))
        if isinstance(self.flash_attn, bool):
            object.__setattr__(self, "flash_attn", "on" if self.flash_attn else "off")
        for name in ("split_mode", "flash_attn", "type_k", "type_v", "draft_type_k", "draft_type_v", "rollback"):
            str_option(name, getattr(self, name))
        # the core's rules, before any weights load (n_ctx 0: with the default in its place)
        pair = self.pair_params()
        if self.n_ctx == 0:
            pair.n_ctx = _PAIR.n_ctx
        pair.validate()
        self.model_params("target").validate()
        self.model_params("drafter").validate()

    def model_params(self, role: str) -> _core.ModelParams:
        """The core's load options for the "target" or the "drafter"."""
        ngl = self.n_gpu_layers
        if role == "drafter" and self.draft_n_gpu_layers is not None:
            ngl = self.draft_n_gpu_layers
        return _core.ModelParams(
            n_gpu_layers=ngl,
            use_mmap=self.use_mmap,
            use_mlock=self.use_mlock,
            main_gpu=self.main_gpu,
            split_mode=self.split_mode,
            tensor_split=list(self.tensor_split),
            rpc_servers=list(self.rpc_servers),
            load_mtp=role == "target" and "draft-mtp" in self.speculative,  # the head's layers
        )

    def pair_params(self) -> _core.PairParams:
        """The core ContextPair's options."""
        return _core.PairParams(
            n_ctx=self.n_ctx,
            n_seq=self.n_parallel,
            kv_unified=self.kv_unified,
            offload_kqv=self.offload_kqv,
            n_batch=self.n_batch,
            n_ubatch=min(self.n_batch, _PAIR.n_ubatch) if self.n_ubatch is None else self.n_ubatch,
            n_threads=self.n_threads or 0,
            n_threads_batch=self.n_threads_batch or 0,
            rope_freq_base=float(self.rope_freq_base),
            draft_max=-1 if self.draft_max is None else self.draft_max,
            rollback=self.rollback,
            flash_attn=self.flash_attn,
            type_k=self.type_k,
            type_v=self.type_v,
            draft_type_k=self.draft_type_k,
            draft_type_v=self.draft_type_v,
            draft_window=-1 if self.draft_window is None else self.draft_window,
            speculative=list(self.speculative),
            ngram=self.ngram.core(),
        )


@dataclasses.dataclass(frozen=True)
class Grammar:
    """A grammar the generated text must follow: GBNF (llama.cpp's grammar format),
    checked when built. ``lazy``: inactive until a trigger appears in the output (a
    regex in ``trigger_patterns`` or a token in ``trigger_tokens``), as the
    tool-call grammars of chat templates are; ``prefill``: tokens the grammar reads
    before the output (the assistant prefix a template appended)."""

    gbnf: str
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.gbnf, str):
            raise TypeError(f"grammar must be a GBNF string, not {type(self.gbnf).__name__}")
        err = _core.grammar_error(self.gbnf)
        if err:
            raise ValueError(f"the grammar does not parse: {err}")

    @classmethod
    def from_json_schema(cls, schema: Mapping[str, Any] | str) -> Grammar:
        """llama.cpp's grammar for a JSON schema (a mapping or JSON text); ``{}`` is
        any JSON object, as in llama-server."""
        if isinstance(schema, Mapping):
            schema = schema_json(schema)
        elif not isinstance(schema, str):
            raise TypeError(f"json_schema must be a mapping or JSON text, not {type(schema).__name__}")
        return cls(_core.json_schema_to_grammar(schema))


class LlamaGrammar(Grammar):
    """llama-cpp-python's name for a ``Grammar``, with its constructors: ``from_string``
    (GBNF), ``from_file`` and ``from_json_schema`` (a JSON schema's text or mapping).
    Anything that takes a grammar takes one: ``generate``, the completions, ``sample``."""

    @classmethod
    def from_string(cls, grammar: str, verbose: bool = True) -> LlamaGrammar:
        """A grammar from GBNF text (``verbose``: accepted, as llama-cpp-python's)."""
        del verbose
        return cls(grammar)

    @classmethod
    def from_file(cls, file: str | os.PathLike[str], verbose: bool = True) -> LlamaGrammar:
        """A grammar from a GBNF file."""
        del verbose
        with open(file, encoding="utf-8") as f:
            return cls(f.read())

    @classmethod
    def from_json_schema(cls, json_schema: Mapping[str, Any] | str, verbose: bool = True) -> LlamaGrammar:
        """llama.cpp's grammar for a JSON schema (see ``Grammar.from_json_schema``)."""
        del verbose
        return cls(Grammar.from_json_schema(json_schema).gbnf)


def schema_json(schema: Mapping[str, Any]) -> str:
    """A JSON schema as JSON text; ``{}`` is any JSON object, as llama-server reads it."""
    return json.dumps(dict(schema) or {"type": "object"})


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Per-call sampling, verification, draft-length and stopping options of
    generate()/stream(). The same transform (llama.cpp's chain: bias, penalties,
    top-n-sigma, top-k, typical-p, top-p, min-p, temperature) applies to the
    target's p and the drafter's q.
    Sampling defaults and rules are the core's (SamplingParams, DraftControl)."""

    # None: until the context is full (the generation, which knows its prompt and its
    # slot's context, computes what is left: Generation.tokens_left)
    max_tokens: int | None = 256
    temperature: float = _SAMPLING.temperature
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    min_p: float = _SAMPLING.min_p
    typical_p: float = _SAMPLING.typical_p
    top_n_sigma: float = _SAMPLING.top_n_sigma
    repeat_penalty: float = _SAMPLING.repeat_penalty
    frequency_penalty: float = _SAMPLING.frequency_penalty
    presence_penalty: float = _SAMPLING.presence_penalty
    penalty_last_n: int = _SAMPLING.penalty_last_n
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # at temperature > 0: "rejection" (speculative sampling), "match", or "coupled" (the
    # target alone's text for the seed: noise keyed by position, shared with the drafter);
    # None: decided by for_seed ("coupled" for a seeded request)
    verify: str | None = None
    draft_max: int | None = None  # None: the Llama's (adaptive unless it pins one); an int pins it
    draft_min: int = 0
    draft_p_min: float = 0.0
    cache_prompt: bool = True  # keep the prefix the caches already hold (llama-server's cache_prompt)
    # each new token's log-probability (results' .logprobs), with the top_logprobs most
    # likely tokens; of the raw logits, or after the sampler chain (post_sampling_probs)
    logprobs: bool = _SAMPLING.logprobs
    top_logprobs: int = _SAMPLING.top_logprobs
    post_sampling_probs: bool = _SAMPLING.post_sampling_probs
    grammar: Grammar | None = None  # the output follows it (GBNF, or a JSON schema's)

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            int_option("max_tokens", self.max_tokens, 0)
        for o in OPTIONS:  # the plain types, as the declaration gives them
            if o.type not in ("bool", "int", "float"):
                continue  # checked below, or where it is built (build: grammar, json_schema)
            value = getattr(self, o.name)
            if o.type == "bool" and not isinstance(value, bool):
                raise TypeError(f"{o.name} must be a bool, not {type(value).__name__}")
            if o.type == "int":
                int_option(o.name, value)
            elif o.type == "float":
                float_option(o.name, value)
        if self.seed is not None:
            int_option("seed", self.seed, bits=64)
        if self.draft_max is not None:
            int_option("draft_max", self.draft_max, 0)  # None is the default, not -1
        for tok, bias in self.logit_bias:
            int_option("logit_bias token", tok)
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise TypeError(f"logit_bias values must be numbers, got {bias!r}")
        if self.verify is not None:
            str_option("verify", self.verify)
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")
        self.core_params(0).validate()  # token ids are checked against the vocabulary when set
        self.draft_control().validate()

    @classmethod
    def build(
        cls,
        *,
        stop: str | Sequence[str] | None = (),
        logit_bias: Mapping[int, float] | None = None,
        verify: str | None = None,
        grammar: Grammar | str | None = None,
        json_schema: Mapping[str, Any] | str | None = None,
        **kw: Any,
    ) -> SamplingConfig:
        """From the keyword arguments of generate()/stream() (the others are this
        class's fields, checked when it is built)."""
        bias = tuple(sorted((operator.index(t), float(b)) for t, b in (logit_bias or {}).items()))
        return cls(
            stop=cls.normalise_stop(stop),
            logit_bias=bias,
            verify=verify,
            grammar=make_grammar(grammar, json_schema),
            **kw,
        )

    def core_params(self, seed: int) -> _core.SamplingParams:
        """The core's sampling options, with the seed this run uses."""
        return _core.SamplingParams(
            **{name: getattr(self, name) for name in _SAMPLING_FIELDS},
            logit_bias=list(self.logit_bias),
            seed=seed & 0xFFFFFFFFFFFFFFFF,
            verify=self.verify or _SAMPLING.verify,
        )

    def for_seed(self, seeded: bool) -> SamplingConfig:
        """This config with ``verify`` decided: None becomes "coupled" for a seeded
        request (its text is then the target alone's and its draft length stays
        adaptive, at an acceptance no lower than the others' on the shipped pair:
        benchmarks/results/coupled-cpu-2core.json), the core's default otherwise."""
        if self.verify is not None:
            return self
        return dataclasses.replace(self, verify="coupled" if seeded else _SAMPLING.verify)

    def draft_control(self) -> _core.DraftControl:
        """The core's draft-length controls (draft_max None: the pair's default)."""
        return _core.DraftControl(
            **{name: getattr(self, name) for name in _DRAFT_FIELDS},
            draft_max=-1 if self.draft_max is None else self.draft_max,
        )

    @staticmethod
    def normalise_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        """``stop`` as a tuple of strings.

        Args:
            stop: One stop string, several, or None.

        Returns:
            The stop strings (empty for None).
        """
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        return tuple(stop)


# the fields SamplingConfig passes to the core's structs as they are: those of the same name
# (a field added to both is passed on; the others are converted where the structs are built)
_CONVERTED = ("logit_bias", "seed", "verify", "draft_max")
_SAMPLING_FIELDS = tuple(
    f.name for f in dataclasses.fields(SamplingConfig) if hasattr(_SAMPLING, f.name) and f.name not in _CONVERTED
)
_DRAFT_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(SamplingConfig)
    if hasattr(_core.DraftControl(), f.name) and f.name not in _CONVERTED
)


def make_grammar(grammar: Grammar | str | None, json_schema: Mapping[str, Any] | str | None) -> Grammar | None:
    """The ``grammar=`` (GBNF text or a ``Grammar``) or ``json_schema=`` option, not both."""
    if grammar is not None and json_schema is not None:
        raise ValueError("give grammar or json_schema, not both")
    if json_schema is not None:
        return Grammar.from_json_schema(json_schema)
    if grammar is None or isinstance(grammar, Grammar):
        return grammar
    if not isinstance(grammar, str):
        raise TypeError(f"grammar must be GBNF text or a Grammar, not {type(grammar).__name__}")
    return Grammar(grammar)


class GenerateOptions(TypedDict, total=False):
    """The keyword-only options of ``generate``/``stream`` (``SamplingConfig``'s
    fields beyond the positional ones; its defaults apply to what is left out)."""

    min_p: float
    typical_p: float
    top_n_sigma: float
    repeat_penalty: float
    frequency_penalty: float
    presence_penalty: float
    penalty_last_n: int
    logit_bias: Mapping[int, float] | None
    verify: str | None
    draft_max: int | None
    draft_min: int
    draft_p_min: float
    cache_prompt: bool
    logprobs: bool
    top_logprobs: int
    post_sampling_probs: bool
    grammar: Grammar | str | None
    json_schema: Mapping[str, Any] | str | None


__all__ = ["CHOICES", "GenerateOptions", "Grammar", "LlamaGrammar", "ModelConfig", "SamplingConfig", "Unpack"]
