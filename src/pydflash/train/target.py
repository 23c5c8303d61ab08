"""What training needs from the target's GGUF: its shape, its frozen token
embedding and output head (dequantized from whatever type the file stores), its
tokenizer keys (the drafter's vocabulary is the target's) and a mask token."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import DraftCompatibilityError, ModelLoadError

__all__ = ["LARGE_TARGET", "TargetInfo", "frozen_tensors", "read_target", "read_tensors", "tokenizer_fields"]

LARGE_TARGET = 2e9  # parameters from which a target's defaults change (a deeper drafter, fewer replies at once)
# llama.cpp's token types
_CONTROL, _UNUSED = 3, 5
# targets whose graph scales the input embeddings by sqrt(n_embd) (the drafter's block then too)
_SCALED_EMBEDDINGS = ("gemma", "gemma2", "gemma3", "gemma3n", "gemma4")


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """The target's shape and identity as training reads them from its GGUF header."""

    path: Path
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_params: int
    rope_theta: float
    rms_eps: float
    embedding_scale: float  # 0: the block's embeddings are used as the table stores them
    fingerprint: str  # size and a hash of the file's head and tail: names its cache
    token_types: tuple[int, ...]
    tokens: tuple[str, ...]
    special_ids: frozenset[int]  # BOS, EOS, EOT, padding, ... (never the mask token)
    eog_ids: frozenset[int]  # EOS, EOT, EOM: a reduced draft vocabulary keeps them

    def mask_token(self, avoid: frozenset[int] = frozenset()) -> int:
        """An unused row of the vocabulary for the drafter's MASK: an UNUSED-typed token if the
        tokenizer has one, else a control token that no special role, chat template or training
        sequence (``avoid``) uses."""
        taken = self.special_ids | avoid
        for wanted in (_UNUSED, _CONTROL):
            for i in range(len(self.token_types) - 1, -1, -1):
                if self.token_types[i] == wanted and i not in taken:
                    return i
        raise DraftCompatibilityError(
            f"{self.path}: the vocabulary has no unused or spare control token to serve as the drafter's mask token"
        )


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def _fingerprint(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 24))
        f.seek(max(0, size - (1 << 24)))
        h.update(f.read(1 << 24))
    return h.hexdigest()[:20]


def _reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file: {e}") from None


def read_target(path: str | Path) -> TargetInfo:
    """The target's header facts; refuses an architecture whose llama.cpp graph records
    no layer inputs (no drafter could read its features)."""
    p = Path(path)
    if not p.is_file():
        raise ModelLoadError(f"{p}: no such file")
    r = _reader(p)
    arch = str(_field(r, "general.architecture"))
    if arch not in _core.layer_input_architectures():
        raise DraftCompatibilityError(
            f"{p}: target architecture '{arch}' does not expose layer inputs in llama.cpp, so no drafter can "
            f"read its features (supported: {', '.join(sorted(_core.layer_input_architectures()))})"
        )

    def key(name: str, default: Any = None) -> Any:
        v = _field(r, f"{arch}.{name}")
        if v is None:
            if default is None:
                raise ModelLoadError(f"{p}: the header has no {arch}.{name}")
            return default
        return v

    n_embd, n_head = int(key("embedding_length")), int(_first(key("attention.head_count")))
    n_ff = key("feed_forward_length")
    tokens = tuple(str(t) for t in (_field(r, "tokenizer.ggml.tokens") or ()))
    types = tuple(int(t) for t in (_field(r, "tokenizer.ggml.token_type") or [1] * len(tokens)))

    def ids(*kinds: str) -> frozenset[int]:
        return frozenset(int(v) for k in kinds if (v := _field(r, f"tokenizer.ggml.{k}_token_id")) is not None)

    return TargetInfo(
        path=p,
        architecture=arch,
        n_layer=int(key("block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(_first(key("attention.head_count_kv", n_head))),
        head_dim=int(key("attention.key_length", n_embd // n_head)),
        n_ff=int(max(n_ff) if isinstance(n_ff, list) else n_ff),
        n_vocab=len(tokens) or int(key("vocab_size")),
        n_ctx_train=int(key("context_length", 4096)),
        n_params=sum(int(np.prod([int(d) for d in t.shape])) for t in r.tensors),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        embedding_scale=math.sqrt(n_embd) if arch in _SCALED_EMBEDDINGS else 0.0,
        fingerprint=_fingerprint(p),
        token_types=types,
        tokens=tokens,
        special_ids=ids("bos", "eos", "eot", "eom", "padding", "unknown", "sep", "cls", "mask"),
        eog_ids=ids("eos", "eot", "eom"),
    )


def _first(v: Any) -> Any:
    """A per-layer array's first value (head counts may be stored per layer)."""
    return v[0] if isinstance(v, list) else v


def read_tensors(path: Path, only: tuple[str, ...] = ()) -> dict[str, npt.NDArray[Any]]:
    """A GGUF's tensors (``only`` these, if given), dequantized to float32 (``I64`` ones, such as
    ``d2t``, as int64), in numpy's (out, in) shape; writable copies."""
    import gguf

    out: dict[str, npt.NDArray[Any]] = {}
    for t in _reader(path).tensors:
        if only and t.name not in only:
            continue
        if t.tensor_type == gguf.GGMLQuantizationType.I64:
            out[t.name] = np.array(t.data, dtype=np.int64)
            continue
        rows = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists the fastest dimension first
        out[t.name] = np.array(rows.reshape(shape), dtype=np.float32, order="C", copy=True)
    return out


def frozen_tensors(path: Path) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(token embedding, output head), each (n_vocab, n_embd) float32; the head is the embedding
    where the target ties them (no ``output.weight``)."""
    t = read_tensors(path, only=("token_embd.weight", "output.weight"))
    if "token_embd.weight" not in t:
        raise ModelLoadError(f"{path}: no token_embd.weight tensor")
    embd = t["token_embd.weight"]
    return embd, t.get("output.weight", embd)


def tokenizer_fields(path: Path) -> Iterator[tuple[str, Any, Any, Any]]:
    """(key, value, type, sub-type) of every ``tokenizer.*`` key, for the drafter's header."""
    import gguf

    r = _reader(path)
    for name, f in r.fields.items():
        if not name.startswith("tokenizer.") or name == "tokenizer.ggml.mask_token_id":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        yield name, f.contents(), vtype, sub
