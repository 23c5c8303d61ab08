"""The drafter's shape: defaults that follow the target's size, the shape of an
``--init`` drafter, and the checks that keep a warm start from training a drafter
that could never load or draft for this target."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .. import _core
from ..errors import DraftCompatibilityError
from .target import LARGE_TARGET, TargetInfo, read_tensors

__all__ = ["DrafterShape", "default_shape", "draft_vocab", "shape_of_drafter", "tap_ids"]


@dataclasses.dataclass(frozen=True)
class DrafterShape:
    """A DFlash drafter's hyper-parameters (upstream llama.cpp's ``dflash`` layout). Widths are the
    target's: the drafter reads its features and borrows its embedding and output head."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rope_theta: float
    rms_eps: float
    n_ctx: int
    block_size: int
    target_layers: tuple[int, ...]  # llama.cpp's ids: the INPUTS of these target layers
    mask_token: int
    embedding_scale: float = 0.0
    # a reduced draft vocabulary: the target ids the drafter's own head scores (llama.cpp's d2t); () = all
    d2t: tuple[int, ...] = ()


def tap_ids(n_target_layers: int, n_taps: int) -> tuple[int, ...]:
    """llama.cpp ids of the target layers to read, spread as upstream's trainers spread them:
    Hugging Face layer outputs from 1 to L-3 (never the last layers; L // 2 for one tap), each + 1
    because llama.cpp records layer INPUTS. A shallow target (under 8 layers) spreads them over
    every layer output but the last."""
    lo, hi = (1, n_target_layers - 3) if n_target_layers >= 8 else (0, max(0, n_target_layers - 2))
    n = max(1, min(n_taps, hi - lo + 1))
    hf = [n_target_layers // 2] if n == 1 else [round(lo + i * (hi - lo) / (n - 1)) for i in range(n)]
    return tuple(sorted({min(h + 1, n_target_layers - 1) for h in hf}))


def default_layers(t: TargetInfo) -> int:
    """Drafter depth: 1 for a target under 2B parameters (its replies are cheap to match and a CPU
    budget buys more steps of one layer than of two), else one per ~10 target layers, up to 5 (the
    paper's 5 for 8B-class targets)."""
    return 1 if t.n_params < LARGE_TARGET else max(1, min(5, round(t.n_layer / 10)))


def default_shape(
    t: TargetInfo, *, mask_token: int, n_layer: int | None = None, block_size: int = 8, n_taps: int | None = None
) -> DrafterShape:
    """A new drafter for ``t``: the target's widths and RoPE base, ``default_layers`` deep,
    reading as many target layers as it has layers (at least 3, at most 5; fewer for a shallow target)."""
    layers = n_layer or default_layers(t)
    taps = n_taps or min(5, max(3, layers))
    return DrafterShape(
        n_layer=layers,
        n_embd=t.n_embd,
        n_head=t.n_head,
        n_head_kv=t.n_head_kv,
        head_dim=t.head_dim,
        n_ff=t.n_ff,
        rope_theta=t.rope_theta,
        rms_eps=t.rms_eps,
        n_ctx=t.n_ctx_train,
        block_size=block_size,
        target_layers=tap_ids(t.n_layer, taps),
        mask_token=mask_token,
        embedding_scale=t.embedding_scale,
    )


def draft_vocab(counts: dict[int, int], n_vocab: int, size: int, keep: frozenset[int]) -> tuple[int, ...]:
    """The ``size`` target ids a reduced-vocabulary drafter scores: ``keep`` (end-of-generation
    tokens), then the most frequent in the target's replies, then the lowest ids (a BPE's earliest,
    most common merges); sorted, as llama.cpp's d2t holds them."""
    chosen = [t for t in sorted(keep) if 0 <= t < n_vocab]
    have = set(chosen)
    for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= size:
            break
        if tok not in have:
            chosen.append(tok)
            have.add(tok)
    nxt = 0
    while len(chosen) < size and nxt < n_vocab:
        if nxt not in have:
            chosen.append(nxt)
            have.add(nxt)
        nxt += 1
    return tuple(sorted(chosen[:size]))


def shape_of_drafter(path: Path, t: TargetInfo, *, block_size: int | None = None) -> DrafterShape:
    """The shape of an existing ``dflash`` GGUF (``--init``), refused with a
    ``DraftCompatibilityError`` naming the mismatch when it cannot draft for ``t``."""
    info = _core.inspect_gguf(str(path))
    arch = str(info["architecture"])
    md = info["metadata"]
    assert isinstance(md, dict)
    where = f"--init {path}: "
    if arch != "dflash":
        raise DraftCompatibilityError(where + f"architecture '{arch}' is not 'dflash'")
    names = list(info["tensor_names"])  # type: ignore[call-overload]
    if md.get("dflash.selector_top_k") or "markov_w1.weight" in names:
        raise DraftCompatibilityError(where + "DFlash2 and DSpark drafters cannot be trained here (DFlash only)")

    def num(key: str, default: float | None = None) -> float:
        v = md.get(f"dflash.{key}")
        if v is None:
            if default is None:
                raise DraftCompatibilityError(where + f"the header has no dflash.{key}")
            return default
        return float(str(v))

    n_embd = int(num("embedding_length"))
    if n_embd != t.n_embd:
        raise DraftCompatibilityError(where + f"hidden size {n_embd} differs from the target's {t.n_embd}")
    n_vocab = _vocab_size(md)
    if n_vocab not in (0, t.n_vocab):
        raise DraftCompatibilityError(where + f"vocabulary size {n_vocab} differs from the target's {t.n_vocab}")
    mask = md.get("tokenizer.ggml.mask_token_id")
    if mask is None or not 0 <= int(str(mask)) < t.n_vocab:
        raise DraftCompatibilityError(where + "no mask token inside the target's vocabulary")
    own_block = int(num("block_size", 16))
    if block_size is not None and block_size != own_block:
        raise DraftCompatibilityError(where + f"block size {own_block} differs from the requested {block_size}")
    layers = _layer_ids(str(md.get("dflash.target_layers", "")))
    if not layers or max(layers) >= t.n_layer:
        raise DraftCompatibilityError(where + f"target layers {list(layers)} do not fit a {t.n_layer}-layer target")
    n_head = int(num("attention.head_count"))
    return DrafterShape(
        n_layer=int(num("block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(num("attention.head_count_kv", n_head)),
        head_dim=int(num("attention.key_length", n_embd // n_head)),
        n_ff=int(num("feed_forward_length")),
        rope_theta=num("rope.freq_base", 10000.0),
        rms_eps=num("attention.layer_norm_rms_epsilon", 1e-6),
        n_ctx=int(num("context_length", t.n_ctx_train)),
        block_size=own_block,
        target_layers=layers,
        mask_token=int(str(mask)),
        embedding_scale=num("embedding_scale", 0.0),
        d2t=_d2t(path) if "d2t" in names else (),
    )


def _d2t(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in read_tensors(path, only=("d2t",))["d2t"])


def _vocab_size(md: dict[str, object]) -> int:
    """The tokenizer's token count as inspect_gguf summarises arrays ("[49152 items]"), 0 if unknown."""
    v = str(md.get("tokenizer.ggml.tokens", ""))
    digits = "".join(c for c in v.split(" ")[0] if c.isdigit())
    return int(digits) if digits else 0


def _layer_ids(v: str) -> tuple[int, ...]:
    """dflash.target_layers as inspect_gguf writes an int array ("[2, 10, 18]")."""
    parts = [p.strip() for p in v.strip("[]").split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        return ()
