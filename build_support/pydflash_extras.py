"""scikit-build-core metadata provider: the ``cuda`` extra's packages.

The CUDA runtime wheels are the CUDA build's run time only: ``pip install ".[cuda]"``
without the switch builds for the CPU, and must not install them around it. So the
extra lists them only when this build is the CUDA one (PYDFLASH_CUDA set to 1, true,
on or yes, as CMakeLists.txt reads it, or GGML_CUDA on in CMAKE_ARGS).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

CUDA_RUNTIME = ["nvidia-cuda-runtime>=13.0,<14", "nvidia-cublas>=13.0.2,<14"]
_ON = {"1", "on", "true", "yes", "y"}
_OFF = {"", "0", "off", "false", "no", "n"}


def cuda_build(env: Mapping[str, str]) -> bool:
    """Whether ``env`` asks for the CUDA build; ValueError for a switch value that is neither."""
    value = env.get("PYDFLASH_CUDA", "").strip().lower()
    if value not in _ON | _OFF:
        raise ValueError(f"PYDFLASH_CUDA must be 1/true/on/yes or 0/false/off/no, got {env['PYDFLASH_CUDA']!r}")
    args = env.get("CMAKE_ARGS", "")
    return value in _ON or re.search(r"GGML_CUDA(:BOOL)?=(?i:on|1|true|yes|y)\b", args) is not None


def dynamic_metadata(field: str, settings: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
    if field != "optional-dependencies":
        raise ValueError(f"this provider gives optional-dependencies only, not {field}")
    return {"cuda": CUDA_RUNTIME if cuda_build(os.environ) else []}
