"""The drafter as a GGUF in upstream llama.cpp's ``dflash`` layout (what its
converter writes: ``dflash.block_size``, ``dflash.target_layers`` as llama.cpp
ids, the target's tokenizer with ``tokenizer.ggml.mask_token_id``, no
``token_embd``/``output``: both are the target's at run time), written to a
temporary file and renamed into place, so a reader never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..gguf_writers.models import Hparams, add_hparams
from .shape import DrafterShape
from .target import TargetInfo, tokenizer_fields

__all__ = ["write_drafter_gguf"]


def write_drafter_gguf(
    path: Path, shape: DrafterShape, target: TargetInfo, tensors: dict[str, npt.NDArray[Any]], *, name: str
) -> Path:
    """Write the drafter (matrices F16, norms F32, ``d2t`` int64) to ``path`` atomically."""
    import gguf

    arch = "dflash"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch)
        w.add_name(name)
        w.add_string("general.base_model.0.name", target.path.name)
        s = shape
        add_hparams(
            w,
            arch,
            Hparams(s.n_ctx, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, s.rope_theta, s.rms_eps),
        )
        w.add_uint32(f"{arch}.block_size", s.block_size)
        w.add_bool(f"{arch}.attention.causal", False)
        w.add_array(f"{arch}.target_layers", [int(x) for x in s.target_layers])
        if s.embedding_scale:
            w.add_float32(f"{arch}.embedding_scale", s.embedding_scale)
        for key, value, vtype, sub in tokenizer_fields(target.path):
            w.add_key_value(key, value, vtype, sub_type=sub)
        w.add_mask_token_id(s.mask_token)
        for tname, arr in tensors.items():
            if np.issubdtype(arr.dtype, np.floating):
                arr = arr.astype(np.float16 if arr.ndim >= 2 else np.float32)
            w.add_tensor(tname, np.ascontiguousarray(arr))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
