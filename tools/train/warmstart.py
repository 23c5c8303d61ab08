"""Start a training run from a shipped GGUF pair (the long-context pair v2
continues the short-context v1): read the F16 tensors back into the torch
modules that wrote them (models.Target / models.Drafter `gguf_tensors`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def gguf_arrays(path: Path) -> dict[str, np.ndarray]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}


def load_into(module: torch.nn.Module, path: Path) -> None:
    """Copy every tensor `module.gguf_tensors()` names from the GGUF at `path`.

    A drafter with more layers than the GGUF's grows it: the GGUF's layers come
    first and each added layer's residual projections (attention output, FFN
    down) start at zero, so the grown drafter first computes exactly what the
    GGUF's drafter does and training starts from its acceptance."""
    have = gguf_arrays(path)
    want = module.gguf_tensors()
    params = dict(_export_params(module))
    added = _added_layers(module, have)
    missing = sorted(n for n in set(want) - set(have) if _layer_of(n) not in added)
    if missing:
        raise ValueError(f"{path}: tensors missing for a warm start: {missing[:4]}")
    with torch.no_grad():
        for i in added:
            for b in (module.layers[i].wo, module.layers[i].down):
                b.weight.zero_()
        for name, p in params.items():
            if _layer_of(name) in added:
                continue
            arr = have[name]
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError(f"{path}: {name} has shape {arr.shape}, the model {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr))


def _export_params(module: torch.nn.Module):
    """(GGUF name, parameter) for Target and Drafter, as models.py exports them."""
    from .models import Drafter, Target

    if isinstance(module, Target):
        yield "token_embd.weight", module.embed.weight
        yield "output.weight", module.head.weight
    elif isinstance(module, Drafter):
        yield "fc.weight", module.fc.weight
        yield "enc.output_norm.weight", module.hidden_norm.weight
    else:
        raise TypeError(type(module).__name__)
    yield "output_norm.weight", module.norm.weight
    for i, b in enumerate(module.layers):
        for suffix, p in (("attn_norm", b.attn_norm.weight), ("attn_q", b.wq.weight), ("attn_k", b.wk.weight),
                          ("attn_v", b.wv.weight), ("attn_output", b.wo.weight), ("attn_q_norm", b.q_norm.weight),
                          ("attn_k_norm", b.k_norm.weight), ("ffn_norm", b.ffn_norm.weight),
                          ("ffn_gate", b.gate.weight), ("ffn_up", b.up.weight), ("ffn_down", b.down.weight)):
            yield f"blk.{i}.{suffix}.weight", p


def _layer_of(name: str) -> int | None:
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def _added_layers(module: torch.nn.Module, have: dict[str, np.ndarray]) -> set[int]:
    """Drafter layers past the GGUF's last one (none for a target: it never grows)."""
    from .models import Drafter

    if not isinstance(module, Drafter):
        return set()
    n_have = len({_layer_of(n) for n in have if _layer_of(n) is not None})
    return set(range(n_have, len(module.layers)))
