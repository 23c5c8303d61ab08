"""A roofline for decode: the machine's memory bandwidth, measured here, and
the bytes one target pass reads, so tokens/s reads as a fraction of what the
memory allows (decode of a large model is bound by reading its weights)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np


def measure_bandwidth(threads: int, mib_per_thread: int = 256, repeats: int = 5) -> float:
    """Copy bandwidth in bytes/s (read + write counted, like STREAM's copy),
    ``threads`` copies at once; the best of ``repeats``."""
    n = mib_per_thread * 2**20 // 8
    src = [np.ones(n) for _ in range(threads)]
    dst = [np.empty(n) for _ in range(threads)]
    best = 0.0
    for _ in range(repeats):
        barrier = threading.Barrier(threads + 1)

        def copy(i: int, barrier: threading.Barrier) -> None:
            barrier.wait()
            np.copyto(dst[i], src[i])  # numpy releases the GIL for the copy

        ts = [threading.Thread(target=copy, args=(i, barrier)) for i in range(threads)]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in ts:
            t.join()
        dt = time.perf_counter() - t0
        best = max(best, 2 * 8 * n * threads / dt)
    return best


def bytes_per_pass(memory: dict[str, Any], n_ctx: int, context_tokens: float) -> float:
    """Weights plus the KV cache a pass attends over (``context_tokens``
    filled slots), for one role's rows of a memory report."""
    model: int = sum(r["model"] for r in memory["rows"] if r["role"] == "target")
    kv: int = sum(r["context"] for r in memory["rows"] if r["role"] == "target")
    return model + kv * min(context_tokens, n_ctx) / n_ctx
