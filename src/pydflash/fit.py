"""Whether a context fits, said before llama.cpp tries to allocate it: a huge
``n_ctx`` otherwise ends in ``std::bad_alloc`` after minutes of paging."""

from __future__ import annotations

import os

from . import _core
from .config import ModelConfig
from .errors import ContextLimitError, PyDFlashError

__all__ = ["check_context_fits", "explain_context_failure", "kv_cache_bytes"]

# bytes per value of llama.cpp's KV cache types (block size and bytes per block)
_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32}
_BYTES.update({"iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32})
_GIB = 1024**3


def _meta_int(meta: dict[str, str], key: str) -> int | None:
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        return None  # absent, or per-layer (an array): the caller falls back


def kv_cache_bytes(model: _core.Model, cfg: ModelConfig) -> int | None:
    """The target's KV cache size for ``cfg.n_ctx`` tokens, from its GGUF header
    (every layer with attention); None where the header does not say."""
    meta, arch = model.metadata, model.architecture
    heads = _meta_int(meta, f"{arch}.attention.head_count")
    kv_heads = _meta_int(meta, f"{arch}.attention.head_count_kv") or heads
    if not heads or not kv_heads:
        return None
    k_len = _meta_int(meta, f"{arch}.attention.key_length") or model.n_embd // heads
    v_len = _meta_int(meta, f"{arch}.attention.value_length") or model.n_embd // heads
    per_token = model.n_layer * kv_heads * (k_len * _BYTES.get(cfg.type_k, 2.0) + v_len * _BYTES.get(cfg.type_v, 2.0))
    return int(per_token * cfg.n_ctx)


def _memory_bytes() -> int:
    """RAM plus the memory of every GPU llama.cpp sees: more than any context may use."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return 0
    gpus = sum(int(str(d.get("memory_total") or 0)) for d in _core.devices() if d.get("type") in ("gpu", "igpu"))
    return ram + gpus


def _needs(need: int, cfg: ModelConfig) -> str:
    return (
        f"n_ctx={cfg.n_ctx} needs about {need / _GIB:.1f} GiB for the target's KV cache alone "
        f"({cfg.type_k}/{cfg.type_v})"
    )


def check_context_fits(model: _core.Model, cfg: ModelConfig) -> None:
    """ContextLimitError when the KV cache alone exceeds all memory (RAM and GPUs)."""
    if model.is_recurrent or model.is_hybrid:
        return  # few layers keep K/V: the estimate would refuse contexts that fit
    need, have = kv_cache_bytes(model, cfg), _memory_bytes()
    if need is not None and have > 0 and need > have:
        raise ContextLimitError(
            f"the context does not fit: {_needs(need, cfg)}, and this machine has {have / _GIB:.1f} GiB of "
            "memory in all; lower n_ctx (or use a quantized cache: type_k/type_v='q8_0')"
        )


def explain_context_failure(err: PyDFlashError, model: _core.Model, cfg: ModelConfig) -> PyDFlashError:
    """llama.cpp's allocation failure as what it means: the context does not fit."""
    text = str(err)
    if "bad_alloc" not in text and "failed to allocate" not in text:
        return err
    need = kv_cache_bytes(model, cfg)
    what = _needs(need, cfg) if need is not None else f"n_ctx={cfg.n_ctx} is too large for the memory available"
    return ContextLimitError(f"the context does not fit: {what}; lower n_ctx ({text})")


def model_context(model: _core.Model) -> int:
    """The context ``model`` was trained with, which ``n_ctx=0`` asks for (llama.cpp's
    ``-c 0``); ValueError where its GGUF names none."""
    n = model.n_ctx_train
    if n < 8:
        raise ValueError(f"n_ctx=0 takes the model's context, but {model.path} names none; give n_ctx")
    return n
