"""The DFlash2, DSpark and reduced-vocabulary (``d2t``) parts of tiny test drafters.

``pydflash.gguf_writers.write_drafter`` writes a DFlash drafter; a
``DrafterVariant`` in its ``DrafterSpec`` adds what makes it one of the other
kinds llama.cpp's ``dflash`` architecture loads (tensor names, shapes and keys
as its loader in ``src/models/dflash.cpp`` and its converter write them):

- ``dflash2``: ``dflash.selector_top_k``/``selector_rank``/``conv_kernel_size``/
  ``conv_group_size``, ``selector_predecessor``/``selector_successor``/
  ``selector_hidden`` and per layer ``attn_conv_base``/``attn_conv_proj``/
  ``ffn_conv_base``/``ffn_conv_proj``.
- ``dspark``: ``markov_w1``/``markov_w2``, optionally ``conf_proj`` (weight and
  bias), ``dflash.sample_from_anchor`` and ``dflash.has_confidence_head``.
- ``d2t_vocab > 0`` (any kind): ``d2t`` (I64 absolute target ids) and the
  drafter's own ``output.weight`` with one row per entry. Given the target's
  file, the reduced vocabulary holds the target head's strongest rows (its
  "hot" tokens) and the drafter's head copies them, so drafts often agree.

Shapes below are numpy's (rows, cols): the reverse of llama.cpp's ``ne``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf

__all__ = ["DrafterVariant", "variant_keys", "variant_tensors"]

KINDS = ("dflash", "dflash2", "dspark")


@dataclasses.dataclass(frozen=True)
class DrafterVariant:
    """Which kind of drafter a test writes (DFlash, DFlash2 or DSpark) and its kind-specific sizes."""

    kind: str = "dflash"  # "dflash", "dflash2" (selector lattice) or "dspark" (Markov + confidence heads)
    selector_top_k: int = 4  # dflash2: n_embd must be >= k (k + 1)
    selector_rank: int = 8
    selector_scale: float = 10.0  # how much the lattice's pair scores move the walk off the argmax
    conv_kernel: int = 3
    conv_group: int = 16  # must divide n_embd
    markov_rank: int = 8  # dspark
    markov_scale: float = 2.0  # size of the Markov bias added to the drafter's logits
    confidence_head: bool = True
    sample_from_anchor: bool = True  # anchor-first blocks (False: a bonus anchor, DFlash's layout)
    d2t_vocab: int = 0  # > 0: a reduced drafter vocabulary of this many target tokens
    # > 0: the drafter's own sliding window (dflash.attention.sliding_window, as llama.cpp's
    # converter writes it for use_swa checkpoints) on the layers swa_layers marks ((): all)
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()
    # broken variants, for tests of the load checks
    d2t_dtype: str = "int64"  # "int32": not the I64 llama.cpp asserts
    d2t_offsets: bool = False  # HF's offsets (target = i + d2t[i]) instead of absolute ids
    d2t_head: bool = True  # False: no own output head (llama.cpp would borrow the full one)
    omit_keys: tuple[str, ...] = ()  # keys (without "dflash.") left out


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed + 5003)  # its own stream: the DFlash tensors stay as they were


def _randn(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _dflash2(
    v: DrafterVariant, rng: np.random.Generator, n_embd: int, n_vocab: int, n_layer: int
) -> dict[str, np.ndarray]:
    r, k = v.selector_rank, v.conv_kernel
    projected = 2 * k * (n_embd // v.conv_group)
    t = {
        "selector_predecessor.weight": _randn(rng, (n_vocab, r), 1.0),
        "selector_successor.weight": _randn(rng, (n_vocab, r), 1.0),
        "selector_hidden.weight": _randn(rng, (r, n_embd), v.selector_scale / np.sqrt(n_embd)),
    }
    for i in range(n_layer):
        for part in ("attn", "ffn"):
            base = _randn(rng, (2, k, n_embd), 0.1)
            base[:, 0, :] += 1.0  # tap 0 passes the position's own hidden state through
            t[f"blk.{i}.{part}_conv_base"] = base
            t[f"blk.{i}.{part}_conv_proj.weight"] = _randn(rng, (projected, n_embd), 0.02 / np.sqrt(n_embd))
    return t


def _dspark(
    v: DrafterVariant, rng: np.random.Generator, n_embd: int, n_vocab: int, n_draft: int
) -> dict[str, np.ndarray]:
    r = v.markov_rank
    t = {
        "markov_w1.weight": _randn(rng, (n_vocab, r), 1.0),
        "markov_w2.weight": _randn(rng, (n_draft, r), v.markov_scale / np.sqrt(r)),
    }
    if v.confidence_head:
        t["conf_proj.weight"] = _randn(rng, (1, n_embd + r), 1.0 / np.sqrt(n_embd + r))
        t["conf_proj.bias"] = np.zeros(1, dtype=np.float32)
    return t


def _d2t(
    v: DrafterVariant, rng: np.random.Generator, n_embd: int, n_vocab: int, target: Path | None
) -> dict[str, np.ndarray]:
    n = v.d2t_vocab
    if target is not None:
        import gguf

        head = next(t for t in gguf.GGUFReader(str(target)).tensors if t.name == "output.weight")
        full = np.asarray(head.data, dtype=np.float32).reshape(n_vocab, n_embd)
        ids = np.sort(np.argsort(-np.linalg.norm(full, axis=1), kind="stable")[:n])
        own = full[ids]
    else:
        ids = np.sort(rng.choice(n_vocab, size=n, replace=False))
        own = _randn(rng, (n, n_embd), 1.0)
    d2t = ids - np.arange(n) if v.d2t_offsets else ids
    t: dict[str, np.ndarray] = {"d2t": d2t.astype(v.d2t_dtype)}
    if v.d2t_head:
        t["output.weight"] = own.astype(np.float32)
    return t


def variant_tensors(
    v: DrafterVariant, n_embd: int, n_vocab: int, n_layer: int, seed: int, target: str | Path | None = None
) -> dict[str, np.ndarray]:
    """The tensors ``v`` adds to a DFlash drafter (``target``: the target's GGUF, for a d2t head)."""
    if v.kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {v.kind!r}")
    if v.d2t_vocab < 0 or v.d2t_vocab > n_vocab:
        raise ValueError(f"d2t_vocab must be in [0, {n_vocab}], got {v.d2t_vocab}")
    rng = _rng(seed)
    n_draft = v.d2t_vocab or n_vocab
    t: dict[str, np.ndarray] = {}
    if v.kind == "dflash2":
        t.update(_dflash2(v, rng, n_embd, n_vocab, n_layer))
    elif v.kind == "dspark":
        t.update(_dspark(v, rng, n_embd, n_vocab, n_draft))
    if v.d2t_vocab:
        t.update(_d2t(v, rng, n_embd, n_vocab, Path(target) if target is not None else None))
    return t


def variant_keys(
    v: DrafterVariant, architecture: str = "dflash", n_layer: int = 1
) -> Callable[[gguf.GGUFWriter], None]:
    """Writes the metadata keys ``v`` adds (``dflash.*``)."""

    def keys(w: gguf.GGUFWriter) -> None:
        if v.sliding_window > 0:
            w.add_sliding_window(v.sliding_window)
            w.add_sliding_window_pattern(list(v.swa_layers) or [True] * n_layer)
        u32: dict[str, int] = {}
        flags: dict[str, bool] = {}
        if v.kind == "dflash2":
            u32 = {
                "selector_top_k": v.selector_top_k,
                "selector_rank": v.selector_rank,
                "conv_kernel_size": v.conv_kernel,
                "conv_group_size": v.conv_group,
            }
        elif v.kind == "dspark":
            flags = {"sample_from_anchor": v.sample_from_anchor, "has_confidence_head": v.confidence_head}
        for name, n in u32.items():
            if name not in v.omit_keys:
                w.add_uint32(f"{architecture}.{name}", n)
        for name, b in flags.items():
            if name not in v.omit_keys:
                w.add_bool(f"{architecture}.{name}", b)

    return keys
