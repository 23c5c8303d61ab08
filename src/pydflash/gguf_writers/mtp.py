"""Tiny ``qwen35`` targets that carry a next-token-prediction head (MTP, ``nextn``).

Qwen3.5/3.6 GGUFs store their MTP head as extra decoder blocks after the trunk:
``block_count`` counts them and ``<arch>.nextn_predict_layers`` says how many
there are. llama.cpp's loader (``src/models/qwen35.cpp``, ``load_block_mtp``)
reads a full-attention block per head (``attn_norm``, ``post_attention_norm``,
gated ``attn_q``, ``attn_k``/``attn_v``/``attn_output``, q/k norms, FFN) plus
``nextn.eh_proj`` (the projection of ``[enorm(embedding); hnorm(h)]``),
``nextn.enorm`` and ``nextn.hnorm``; ``nextn.shared_head_norm``/``_head`` are
optional (the trunk's output norm and head otherwise). Its MTP graph runs
exactly one head.

The trunk is ``write_hybrid_target``'s for the same ``HybridSpec`` (same
seed, same tensors), so a target with and without the head decode alike.
Random heads draft poorly; ``MtpSpec.copy`` makes the head predict from the
token it is given, which matches a target whose layers barely move the
residual stream (small ``ssm_out_scale``): drafts are then often accepted.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import models as _t
from .models import HybridSpec

if TYPE_CHECKING:
    import gguf

__all__ = ["MtpSpec", "write_mtp_target"]

_QWEN35 = HybridSpec()


@dataclasses.dataclass(frozen=True)
class MtpSpec:
    layers: int = 1  # nextn_predict_layers (llama.cpp's qwen35 MTP graph runs one; 0 writes no head)
    # > 0: eh_proj passes one half of its input through (this times the identity): "h", the
    # target's last hidden state, makes the head predict what the target just predicted (the
    # token it is given): drafts that repeat; "embedding": the token's embedding alone
    copy: float = 0.0
    copy_from: str = "h"
    block_scale: float = 1.0  # the head block's attention and FFN output weights (small: eh_proj dominates)
    own_head: bool = False  # write nextn.shared_head_norm/_head (else the trunk's are used)
    seed: int = 3
    omit: tuple[str, ...] = ()  # tensor name suffixes left out (broken variants), e.g. "nextn.eh_proj"


def _randn(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32)


def _ffn(
    rng: np.random.Generator, p: str, e: int, n_ff: int, out_scale: float, suffix: str = ""
) -> dict[str, np.ndarray]:
    return {
        f"{p}ffn_gate{suffix}.weight": _randn(rng, (n_ff, e), 1.0 / np.sqrt(e)),
        f"{p}ffn_up{suffix}.weight": _randn(rng, (n_ff, e), 1.0 / np.sqrt(e)),
        f"{p}ffn_down{suffix}.weight": _randn(rng, (e, n_ff), out_scale / np.sqrt(n_ff)),
    }


def _head_block(rng: np.random.Generator, il: int, s: HybridSpec, m: MtpSpec) -> dict[str, np.ndarray]:
    e = s.n_embd
    sc = 1.0 / np.sqrt(e)
    nh = s.n_head * s.head_dim
    eh = _randn(rng, (e, 2 * e), 1.0 / np.sqrt(2 * e))
    if m.copy:
        eh *= 0.1
        half = slice(e, 2 * e) if m.copy_from == "h" else slice(0, e)  # [enorm(embedding); hnorm(h)]
        eh[:, half] += (m.copy * np.eye(e)).astype(np.float32)
    p = f"blk.{il}."
    t = {
        p + "attn_norm.weight": _norm(rng, e),
        p + "post_attention_norm.weight": _norm(rng, e),
        p + "attn_q.weight": _randn(rng, (2 * nh, e), sc),  # query and gate, per head
        p + "attn_k.weight": _randn(rng, (s.n_head_kv * s.head_dim, e), sc),
        p + "attn_v.weight": _randn(rng, (s.n_head_kv * s.head_dim, e), sc),
        p + "attn_output.weight": _randn(rng, (e, nh), m.block_scale / np.sqrt(nh)),
        p + "attn_q_norm.weight": _norm(rng, s.head_dim),
        p + "attn_k_norm.weight": _norm(rng, s.head_dim),
        p + "nextn.eh_proj.weight": eh,
        p + "nextn.enorm.weight": _norm(rng, e),
        p + "nextn.hnorm.weight": _norm(rng, e),
    }
    if s.architecture == "qwen35moe":  # routed experts and a shared one, as the trunk's
        n_ff_exp = s.n_ff // s.n_expert_used
        t[p + "ffn_gate_inp.weight"] = _randn(rng, (s.n_expert, e), sc)
        t[p + "ffn_gate_exps.weight"] = _randn(rng, (s.n_expert, n_ff_exp, e), sc)
        t[p + "ffn_up_exps.weight"] = _randn(rng, (s.n_expert, n_ff_exp, e), sc)
        down = m.block_scale / np.sqrt(n_ff_exp)
        t[p + "ffn_down_exps.weight"] = _randn(rng, (s.n_expert, e, n_ff_exp), down)
        t[p + "ffn_gate_inp_shexp.weight"] = _randn(rng, (e,), sc)
        t.update(_ffn(rng, p, e, s.n_ff, m.block_scale, "_shexp"))
    else:
        t.update(_ffn(rng, p, e, s.n_ff, m.block_scale))
    if m.own_head:
        t[p + "nextn.shared_head_norm.weight"] = _norm(rng, e)
        t[p + "nextn.shared_head_head.weight"] = _randn(rng, (s.n_vocab, e), sc)
    return {k: v for k, v in t.items() if not any(k.endswith(o + ".weight") for o in m.omit)}


def write_mtp_target(path: str | Path, spec: HybridSpec = _QWEN35, mtp: MtpSpec = MtpSpec()) -> Path:
    """Write a tiny hybrid target (``spec``, ``qwen35`` or ``qwen35moe``) with ``mtp.layers``
    next-token-prediction heads after its trunk."""
    s = spec
    if s.architecture not in ("qwen35", "qwen35moe"):
        raise ValueError(f"MTP heads are written for 'qwen35' and 'qwen35moe' targets, got {s.architecture!r}")
    if mtp.layers < 0:
        raise ValueError(f"layers must be >= 0, got {mtp.layers}")
    tensors, tok = _t.hybrid_tensors(s)
    rng = np.random.default_rng(s.seed + mtp.seed + 7717)  # its own stream: the trunk is unchanged
    for j in range(mtp.layers):
        tensors.update(_head_block(rng, s.n_layer + j, s, mtp))
    n_all = s.n_layer + mtp.layers
    hp = _t.Hparams(s.n_ctx, s.n_embd, n_all, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)

    def keys(w: gguf.GGUFWriter) -> None:
        _t.hybrid_keys(w, s)
        if mtp.layers:
            w.add_uint32(f"{s.architecture}.nextn_predict_layers", mtp.layers)

    name = f"pydflash tiny {s.architecture} MTP target"
    write = functools.partial(_t.write_gguf, mask_token=False, extra_kv=None, arch_keys=keys)
    return write(path, s.architecture, name, hp, tok, tensors)
