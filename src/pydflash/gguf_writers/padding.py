"""Make a memory-bound copy of a small target: zero-pad its FFN.

A few-million-parameter model decodes compute- and overhead-bound on a CPU,
unlike a large model on a GPU, whose decode is bound by reading its weights.
Padding every FFN with zero rows (gate, up) and zero columns (down) makes each
token read as many bytes as a much larger model while every output stays the
same: silu(0) * 0 = 0 and the extra columns multiply zeros. Verifying several
tokens then costs about as much as one, as it does for a large model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import gguf
    import numpy.typing as npt

__all__ = ["pad_ffn"]


def pad_ffn(src: str | Path, dst: str | Path, n_ff: int, *, dtype: npt.DTypeLike = np.float32) -> Path:
    """Write ``src`` (a qwen3/llama-style GGUF with F32/F16 tensors) to
    ``dst`` with feed-forward width ``n_ff``; tensors are stored as ``dtype``."""
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    old = int(r.fields[f"{arch}.feed_forward_length"].parts[-1][0])
    if n_ff < old:
        raise ValueError(f"n_ff {n_ff} is smaller than the model's {old}")
    w = gguf.GGUFWriter(str(dst), arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.feed_forward_length":
            w.add_uint32(name, n_ff)
            continue
        _copy_field(w, name, field)
    for t in r.tensors:
        data = np.asarray(t.data)
        if data.dtype not in (np.float32, np.float16):
            raise ValueError(f"{t.name}: only F32/F16 tensors can be padded")
        data = data.astype(dtype if data.ndim >= 2 else np.float32)
        if t.name.endswith(("ffn_gate.weight", "ffn_up.weight")):
            data = np.concatenate([data, np.zeros((n_ff - old, data.shape[1]), data.dtype)], 0)
        elif t.name.endswith("ffn_down.weight"):
            data = np.concatenate([data, np.zeros((data.shape[0], n_ff - old), data.dtype)], 1)
        w.add_tensor(t.name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)


def _copy_field(w: gguf.GGUFWriter, name: str, field: gguf.ReaderField) -> None:
    import gguf

    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1] if len(field.types) > 1 else gguf.GGUFValueType.INT32
        if sub == gguf.GGUFValueType.STRING:
            vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        else:
            vals = [field.parts[i][0].item() for i in field.data]
        w.add_array(name, vals)
    elif vtype == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(field.parts[-1]).decode("utf-8"))
    else:
        w.add_key_value(name, field.parts[-1][0].item(), vtype)
