"""Start the target's training from a shipped GGUF (pair v2 continued v1's
target): read the F16 tensors back into the torch module that wrote them
(models.Target `gguf_tensors`). The drafter's warm start is pydflash.train's
`--init`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def gguf_arrays(path: Path) -> dict[str, np.ndarray]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}


def load_into(module: torch.nn.Module, path: Path) -> None:
    """Copy every tensor `module.gguf_tensors()` names from the GGUF at `path`."""
    have = gguf_arrays(path)
    params = dict(_export_params(module))
    missing = sorted(set(params) - set(have))
    if missing:
        raise ValueError(f"{path}: tensors missing for a warm start: {missing[:4]}")
    with torch.no_grad():
        for name, p in params.items():
            arr = have[name]
            if tuple(arr.shape) != tuple(p.shape):
                raise ValueError(f"{path}: {name} has shape {arr.shape}, the model {tuple(p.shape)}")
            p.copy_(torch.from_numpy(arr))


def _export_params(module: torch.nn.Module):
    """(GGUF name, parameter) of models.Target, as models.py exports them."""
    from .models import Target

    if not isinstance(module, Target):
        raise TypeError(type(module).__name__)
    yield "token_embd.weight", module.embed.weight
    yield "output.weight", module.head.weight
    yield "output_norm.weight", module.norm.weight
    for i, b in enumerate(module.layers):
        for suffix, p in (("attn_norm", b.attn_norm.weight), ("attn_q", b.wq.weight), ("attn_k", b.wk.weight),
                          ("attn_v", b.wv.weight), ("attn_output", b.wo.weight), ("attn_q_norm", b.q_norm.weight),
                          ("attn_k_norm", b.k_norm.weight), ("ffn_norm", b.ffn_norm.weight),
                          ("ffn_gate", b.gate.weight), ("ffn_up", b.up.weight), ("ffn_down", b.down.weight)):
            yield f"blk.{i}.{suffix}.weight", p
