"""The compute devices of this build."""

from __future__ import annotations

from typing import Any

from . import _core

__all__ = ["backends"]


def backends() -> list[dict[str, Any]]:
    """The compute devices llama.cpp can use in this build: name, description,
    type ("cpu", "gpu", "igpu", "accel"), backend, memory_free, memory_total
    (bytes). Devices of RPC servers appear once a Llama has connected to them;
    their memory reads 0 (asking would need the server to be up)."""
    return list(_core.devices())
