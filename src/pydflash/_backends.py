"""ggml's backends in the dynamic-backend (CUDA) build: load them from the package.

Imported first by ``pydflash/__init__.py``: llama.cpp must see its backends before it
enumerates devices. In the default build the backends are linked into ``_core`` and
``_core.load_backends`` only reports them.

The CUDA backend module (``pydflash/lib/libggml-cuda.so``) needs the CUDA runtime and
cuBLAS. The ``cuda`` extra installs them as wheels (``nvidia/cu13/lib`` in
site-packages); they are preloaded here with ``RTLD_GLOBAL`` so that the module finds
them whatever its RPATH. Without a GPU or driver the CUDA backend loads no device (or
does not load at all) and llama.cpp uses the CPU; the reason is kept in
``_core.backend_load_errors()``, nothing is printed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os

from . import _core

#: Where the dynamic build installs llama.cpp's libraries and ggml's backend modules;
#: PYDFLASH_BACKEND_DIR loads the backend modules from another folder instead.
LIB_DIR = os.environ.get("PYDFLASH_BACKEND_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")

# In dependency order (cuBLAS needs cuBLASLt).
_CUDA_LIBS = ("libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13")

#: Paths of the CUDA libraries preloaded from wheels at import.
preloaded: list[str] = []


def _nvidia_lib_dirs() -> list[str]:
    """``.../site-packages/nvidia/cu13/lib`` of the installed nvidia-* wheels."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [os.path.join(p, "cu13", "lib") for p in spec.submodule_search_locations]


def _preload_cuda_libraries() -> list[str]:
    done = []
    dirs = _nvidia_lib_dirs()
    for name in _CUDA_LIBS:
        for d in dirs:
            path = os.path.join(d, name)
            if not os.path.isfile(path):
                continue
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            done.append(path)
            break
    return done


def _load() -> None:
    if not _core.dynamic_backends():
        return  # linked in; llama.cpp starts lazily as before
    if os.path.isfile(os.path.join(LIB_DIR, "libggml-cuda.so")):
        preloaded.extend(_preload_cuda_libraries())
    _core.load_backends(LIB_DIR)


_load()
