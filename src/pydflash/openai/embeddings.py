"""``create_embedding`` / ``embed``: the target's pooled hidden states, shaped as
llama-cpp-python returns them (an OpenAI embedding list, or plain float lists)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypedDict

import numpy as np
import numpy.typing as npt

__all__ = ["CreateEmbeddingResponse", "Embedding", "EmbeddingUsage", "embed_texts", "embedding_response"]

Vector = list[float]


class Embedding(TypedDict):
    object: Literal["embedding"]
    embedding: Vector | list[Vector]  # per token when the pooling is "none"
    index: int


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(TypedDict):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


def embed_texts(
    texts: Sequence[str],
    tokenize: Callable[[str], list[int]],
    run: Callable[[list[int]], npt.NDArray[np.float32]],
    limit: int,
    *,
    pooled: bool,
    normalize: bool,
    truncate: bool,
) -> tuple[list[Vector | list[Vector]], int]:
    """Each text's vector (``pooled``: one row; else one row per token) and the
    tokens read. ``truncate``: a text longer than ``limit`` tokens is cut, else it raises."""
    out: list[Vector | list[Vector]] = []
    total = 0
    for text in texts:
        if not isinstance(text, str):
            raise TypeError(f"embedding input must be str or a list of str, not {type(text).__name__}")
        ids = tokenize(text)
        if truncate:
            ids = ids[:limit]
        total += len(ids)
        rows = run(ids).astype(np.float64)
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.where(norms > 0, norms, 1.0)
        vectors = [[float(x) for x in row] for row in rows]
        out.append(vectors[0] if pooled else vectors)
    return out, total


def embedding_response(vectors: Sequence[Vector | list[Vector]], n_tokens: int, model: str) -> CreateEmbeddingResponse:
    return {
        "object": "list",
        "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }
