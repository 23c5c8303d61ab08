"""Prompts for the benchmark: text of exactly ISL tokens, cut from Python
standard-library files that the embedded pair did not train on (the same
file split as its training: a stable hash of the path puts 5% of the files in
the held-out set). The embedded target is a code model: prose
(pydoc_data/topics.py, a third of the held-out text) and generated codec
tables (encodings/) are left out of the prompts."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..llama import Llama

# The embedded pair's train / held-out split (tools/train/corpus.py uses it too).
SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "lib2to3", "__pycache__"}
NOT_CODE = {"pydoc_data", "encodings"}


def stdlib_files() -> list[Path]:
    """This interpreter's standard-library sources, in a stable order."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in lib.rglob("*.py") if not SKIP_PARTS.intersection(p.relative_to(lib).parts)]
    return sorted(files, key=lambda p: str(p.relative_to(lib)))


def is_heldout(path: Path, percent: int = 5) -> bool:
    """A stable hash of the path relative to the standard library."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return hashlib.sha256(str(path.relative_to(lib)).encode()).digest()[0] * 100 // 256 < percent


def heldout_stdlib_text(percent: int = 5) -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts = [
        p.read_text(encoding="utf-8", errors="replace")
        for p in stdlib_files()
        if not NOT_CODE.intersection(p.relative_to(lib).parts) and is_heldout(p, percent)
    ]
    if not parts:
        raise RuntimeError(f"no standard-library source found under {lib}")
    return "\n\n".join(parts)


def heldout_prose_text() -> str:
    """English prose the embedded pair did not train on: the held-out
    pydoc_data/topics.py's help topics (the text of its strings). A code model's
    drafter is rarely right here: the workload where drafting pays least."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


WORKLOADS = {"code": heldout_stdlib_text, "prose": heldout_prose_text}


def make_prompts(
    tokenize: Callable[[str], list[int]], detokenize: Callable[[list[int]], str], isl: int, count: int, corpus: str
) -> list[str]:
    """``count`` different prompts whose text tokenizes to ``isl`` tokens
    (BOS included where the vocabulary adds one)."""
    ids = tokenize(corpus)
    bos = len(tokenize("")) if isl > 1 else 0  # tokens tokenize() adds by itself
    body = isl - bos
    if len(ids) < body * count:
        reps = body * count // max(len(ids), 1) + 1
        ids = ids * reps  # a very long ISL: the corpus repeats
    prompts = []
    stride = max(body, (len(ids) - body) // max(count, 1))
    for i in range(count):
        for start in range(i * stride, len(ids) - body + 1):
            # windows that begin at a line start tokenize like the corpus did
            if start and not detokenize(ids[start - 1 : start]).endswith("\n"):
                continue
            window = ids[start : start + body]
            text = detokenize(window)
            # llama.cpp's tools drop one trailing newline of a prompt file, and
            # a cut can change how the edges tokenize: take windows that
            # survive both, so every engine sees exactly isl tokens
            if not text.endswith("\n") and len(tokenize(text)) == isl:
                prompts.append(text)
                break
        else:
            raise RuntimeError(f"no prompt of exactly {isl} tokens found after offset {i * stride}")
    return prompts


def text_codec(llm: Llama) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """``llm``'s tokenizer as the prompt builders use it: text in (special tokens
    read as the completions read them), text out."""
    return (lambda t: llm.tokenize(t, special=True)), (lambda ids: llm.detokenize(ids).decode("utf-8", "replace"))
