#!/usr/bin/env python3
"""Apply pydflash's patches to the vendored llama.cpp tree (idempotent).

DFlash reads a target's features through llama.cpp's layer-input capture,
which a model graph feeds with one line at the top of its layer loop
(``res->t_layer_inp[il] = inpL;``). The pinned tree has that line for llama,
qwen3 and a few others; this adds it to the common architectures that lack
it. Each patch is checked: a graph file whose layer loop is not exactly the
one this script knows stops the build, so a changed upstream file fails
loudly instead of building a target that silently gives a drafter nothing.

Usage: python tools/patch_llama_cpp.py [--src vendor/llama.cpp] [--check]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

LOOP = "    for (int il = 0; il < n_layer; ++il) {\n"
CAPTURE = "        res->t_layer_inp[il] = inpL;\n"

# architecture (llama.cpp's name) -> its graph file under src/models/. Each file's
# one layer loop starts with inpL holding that layer's input (the residual stream).
LAYER_INPUT_GRAPHS = {
    "qwen2": "qwen2.cpp",
    "qwen2moe": "qwen2moe.cpp",
    "gemma2": "gemma2.cpp",
    "gemma3": "gemma3.cpp",
    "phi3": "phi3.cpp",
    "smollm3": "smollm3.cpp",
    "mistral3": "mistral3.cpp",
    "olmo2": "olmo2.cpp",
    "starcoder2": "starcoder2.cpp",
    "exaone": "exaone.cpp",
    "exaone4": "exaone4.cpp",
    "internlm2": "internlm2.cpp",
    "glm4": "glm4.cpp",
    "apertus": "apertus.cpp",
    "arcee": "arcee.cpp",
    "seed_oss": "seed-oss.cpp",
    "ernie4_5": "ernie4-5.cpp",
}


class PatchError(RuntimeError):
    pass


def patch_file(path: Path, check_only: bool) -> bool:
    """Add the capture line to `path`'s layer loop; True when the file changed."""
    if not path.is_file():
        raise PatchError(f"{path}: missing (the vendored llama.cpp changed?)")
    text = path.read_text()
    n_loops = text.count(LOOP)
    if n_loops != 1:
        raise PatchError(f"{path}: expected one layer loop '{LOOP.strip()}', found {n_loops}")
    if LOOP + CAPTURE in text:
        return False
    if CAPTURE in text:
        raise PatchError(f"{path}: records layer inputs somewhere other than its loop's first line")
    if check_only:
        raise PatchError(f"{path}: not patched (run tools/patch_llama_cpp.py)")
    path.write_text(text.replace(LOOP, LOOP + CAPTURE))
    return True


def apply(src: Path, check_only: bool = False) -> list[str]:
    """Patch every graph in LAYER_INPUT_GRAPHS; returns the architectures changed."""
    changed = []
    for arch, name in LAYER_INPUT_GRAPHS.items():
        if patch_file(src / "src" / "models" / name, check_only):
            changed.append(arch)
    return changed


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=root / "vendor" / "llama.cpp")
    ap.add_argument("--check", action="store_true", help="fail if a graph is not patched; change nothing")
    a = ap.parse_args(argv)
    try:
        changed = apply(a.src, a.check)
    except PatchError as e:
        print(f"patch_llama_cpp: {e}", file=sys.stderr)
        return 1
    what = ", ".join(changed) if changed else "none (already patched)"
    print(f"patch_llama_cpp: layer inputs recorded for {len(LAYER_INPUT_GRAPHS)} more architectures; "
          f"patched now: {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
