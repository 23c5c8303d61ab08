"""Typed, validated option sets, built once per call from keyword arguments."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

if TYPE_CHECKING:
    from . import _core


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


def _float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


ROLLBACK_KINDS = ("auto", "kv-trim", "recurrent-planes", "checkpoint")
SPLIT_MODES = ("none", "layer", "row")
FLASH_ATTN = ("auto", "on", "off")
# llama.cpp's KV cache types (its --cache-type-k/-v names)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_FLOAT_CACHE_TYPES = ("f32", "f16", "bf16")


def _choice(name: str, value: object, choices: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _endpoint(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"rpc_servers entries must be 'host:port' strings, not {type(value).__name__}")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"rpc_servers entries must be 'host:port', got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """How the pair is loaded, where its layers go and how its contexts are
    sized. Device options apply where a GPU or RPC backend exists; on a CPU-only
    build the layers stay on the CPU."""

    n_ctx: int = 4096
    n_batch: int = 512
    n_gpu_layers: int = 0                 # target layers to offload; -1: all
    draft_n_gpu_layers: Optional[int] = None  # the drafter's; None: as n_gpu_layers
    main_gpu: int = 0                     # the device used with split_mode "none"
    split_mode: str = "layer"             # across several GPUs: "none", "layer" or "row"
    tensor_split: tuple[float, ...] = ()  # share of the model per device; (): by free memory
    rpc_servers: tuple[str, ...] = ()     # "host:port" of ggml RPC servers (offload targets)
    flash_attn: str = "auto"              # "auto", "on" or "off" (True/False accepted), both contexts
    type_k: str = "f16"                   # the target's KV cache types
    type_v: str = "f16"
    draft_type_k: str = "f16"             # the drafter's
    draft_type_v: str = "f16"
    n_threads: Optional[int] = None
    draft_max: Optional[int] = None
    seed: int = 0
    rollback: str = "auto"

    def __post_init__(self) -> None:
        _int("n_ctx", self.n_ctx, 8)
        _int("n_batch", self.n_batch, 1)
        _int("n_gpu_layers", self.n_gpu_layers, -1)
        if self.draft_n_gpu_layers is not None:
            _int("draft_n_gpu_layers", self.draft_n_gpu_layers, -1)
        _int("main_gpu", self.main_gpu, 0)
        _choice("split_mode", self.split_mode, SPLIT_MODES)
        if isinstance(self.tensor_split, (str, bytes)) or not isinstance(self.tensor_split, Sequence):
            raise TypeError(f"tensor_split must be a sequence of numbers, not {type(self.tensor_split).__name__}")
        split = tuple(_float("tensor_split entry", x) for x in self.tensor_split)
        if any(x < 0 for x in split) or (split and not any(split)):
            raise ValueError(f"tensor_split entries must be >= 0 and not all 0, got {split}")
        object.__setattr__(self, "tensor_split", split)
        if isinstance(self.rpc_servers, str):  # llama.cpp's --rpc takes "a:1,b:2"
            object.__setattr__(self, "rpc_servers", tuple(x for x in self.rpc_servers.split(",") if x))
        object.__setattr__(self, "rpc_servers", tuple(_endpoint(x) for x in self.rpc_servers))
        if isinstance(self.flash_attn, bool):
            object.__setattr__(self, "flash_attn", "on" if self.flash_attn else "off")
        _choice("flash_attn", self.flash_attn, FLASH_ATTN)
        for name in ("type_k", "type_v", "draft_type_k", "draft_type_v"):
            _choice(name, getattr(self, name), CACHE_TYPES)
            if name.endswith("_v") and self.flash_attn == "off" and getattr(self, name) not in _FLOAT_CACHE_TYPES:
                raise ValueError(f"{name}={getattr(self, name)!r} is quantized, which needs flash_attn 'on' or 'auto'")
        if self.n_threads is not None:
            _int("n_threads", self.n_threads, 1)
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0)
        _int("seed", self.seed, -(2**63))
        _choice("rollback", self.rollback, ROLLBACK_KINDS)

    def model_params(self, role: str) -> "_core.ModelParams":
        """The core's load options for the "target" or the "drafter"."""
        from . import _core

        ngl = self.n_gpu_layers
        if role == "drafter" and self.draft_n_gpu_layers is not None:
            ngl = self.draft_n_gpu_layers
        return _core.ModelParams(n_gpu_layers=ngl, main_gpu=self.main_gpu, split_mode=self.split_mode,
                                 tensor_split=list(self.tensor_split), rpc_servers=list(self.rpc_servers))

    def pair_options(self) -> dict[str, object]:
        """The core ContextPair's keyword options."""
        return dict(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=min(self.n_batch, 512),
                    n_threads=self.n_threads or 0, draft_max=-1 if self.draft_max is None else self.draft_max,
                    rollback=self.rollback, flash_attn=self.flash_attn, type_k=self.type_k, type_v=self.type_v,
                    draft_type_k=self.draft_type_k, draft_type_v=self.draft_type_v)


VERIFY_MODES = ("rejection", "match")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Per-call sampling, verification, draft-length and stopping options of
    generate()/stream(). The same transform (penalties, bias, temperature,
    top-k, top-p, min-p) applies to the target's p and the drafter's q."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    penalty_last_n: int = 64
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: Optional[int] = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    verify: str = "rejection"   # at temperature > 0: "rejection" (speculative sampling) or "match"
    draft_max: Optional[int] = None
    draft_min: int = 0
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        _int("max_tokens", self.max_tokens, 0)
        if _float("temperature", self.temperature) < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        _int("top_k", self.top_k, 0)
        p = _float("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        if self.seed is not None:
            _int("seed", self.seed, -(2**63))
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0)
        _int("draft_min", self.draft_min, 0)
        if not 0.0 <= _float("draft_p_min", self.draft_p_min) <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], got {self.draft_p_min}")
        if not 0.0 <= _float("min_p", self.min_p) < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if _float("repeat_penalty", self.repeat_penalty) <= 0:
            raise ValueError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        _float("frequency_penalty", self.frequency_penalty)
        _float("presence_penalty", self.presence_penalty)
        _int("penalty_last_n", self.penalty_last_n, 0)
        for tok, bias in self.logit_bias:
            _int("logit_bias token", tok, 0)
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias != bias:
                raise TypeError(f"logit_bias values must be numbers, got {bias!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        for s in self.stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")

    @classmethod
    def build(cls, *, stop: str | Sequence[str] | None = (), logit_bias: Optional[Mapping[int, float]] = None,
              verify: Optional[str] = None, **kw: object) -> "SamplingConfig":
        """From the keyword arguments of generate()/stream()."""
        bias = tuple(sorted((operator.index(t), float(b)) for t, b in (logit_bias or {}).items()))
        return cls(stop=cls.normalise_stop(stop), logit_bias=bias,
                   verify="rejection" if verify is None else verify, **kw)  # type: ignore[arg-type]

    def sampling_args(self, seed: int) -> dict[str, object]:
        """Keyword arguments of ContextPair.set_sampling."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                    repeat_penalty=self.repeat_penalty, frequency_penalty=self.frequency_penalty,
                    presence_penalty=self.presence_penalty, penalty_last_n=self.penalty_last_n,
                    logit_bias=list(self.logit_bias), seed=seed & 0xFFFFFFFFFFFFFFFF, verify=self.verify)

    @staticmethod
    def normalise_stop(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        return tuple(stop)
