"""What other llama-style architectures change in a tiny target's tensors
(``write_target(..., architecture=...)``): the layouts of the graphs that
tools/patch_llama_cpp.py teaches to record layer inputs."""

from __future__ import annotations

import numpy as np

__all__ = ["NO_QK_NORM", "arch_tensors"]

# graphs without per-head q/k RMS norms
NO_QK_NORM = ("qwen2", "llama", "smollm3", "phi3", "xverse")


def _phi3(t: dict[str, np.ndarray], n_layer: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # one ffn_up of twice the width: gate rows first, then up rows (llama.cpp splits it)
    for i in range(n_layer):
        gate = t.pop(f"blk.{i}.ffn_gate.weight")
        t[f"blk.{i}.ffn_up.weight"] = np.concatenate([gate, t[f"blk.{i}.ffn_up.weight"]], 0)
    return t


def _gemma3(t: dict[str, np.ndarray], n_layer: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # RMS norms after attention and after the FFN, as Gemma 2/3 have them
    n_embd = t["blk.0.attn_norm.weight"].shape[0]
    for i in range(n_layer):
        for name in ("post_attention_norm", "post_ffw_norm"):
            t[f"blk.{i}.{name}.weight"] = np.asarray(1.0 + 0.05 * rng.standard_normal(n_embd), dtype=np.float32)
    return t


def arch_tensors(
    architecture: str, tensors: dict[str, np.ndarray], n_layer: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """``tensors`` (the qwen3 layout, without q/k norms for ``NO_QK_NORM``) in ``architecture``'s layout."""
    change = {"phi3": _phi3, "gemma3": _gemma3}.get(architecture)
    return tensors if change is None else change(tensors, n_layer, rng)
