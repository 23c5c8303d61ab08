"""tau measured online: the drafter as it stands, written to a GGUF, drafting for
the target in pydflash's own engine on held-out prompts at a pinned draft length.
Offline slot accuracy can read 0.99 while real acceptance is 0.12 (a wrong mask,
block size or layer list trains "fine"); this is the figure that counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..llama import Llama
from .data import Chunk

__all__ = ["Measured", "measure_tau", "reference_outputs"]


@dataclasses.dataclass(frozen=True)
class Measured:
    """One online measurement: tau (tokens per target pass), acceptance, and whether every
    output equalled the target's own greedy reply."""

    tau: float
    acceptance: float
    lossless: bool
    n_tokens: int
    n_steps: int


def _n_ctx(held: Chunk, max_tokens: int) -> int:
    return int(max(held.prompt_lens)) + max_tokens + 16


def reference_outputs(
    target: Path, held: Chunk, *, max_tokens: int, n_threads: int, n_gpu_layers: int = 0
) -> list[list[int]]:
    """The target alone's greedy continuations of ``held``'s prompts, one sequence at a time as the
    measurement decodes them (a batched pass can flip a near-tie of a quantized model)."""
    with Llama(str(target), n_ctx=_n_ctx(held, max_tokens), n_threads=n_threads, n_gpu_layers=n_gpu_layers) as llm:
        return [
            list(llm.generate(_prompt(held, i), max_tokens=max_tokens, temperature=0.0, ignore_eos=True).tokens)
            for i in range(len(held))
        ]


def _prompt(held: Chunk, i: int) -> list[int]:
    return [int(t) for t in held.sequence(i)[: int(held.prompt_lens[i])]]


def measure_tau(
    target: Path,
    drafter: Path,
    held: Chunk,
    reference: list[list[int]],
    *,
    draft_max: int,
    n_threads: int,
    n_gpu_layers: int = 0,
) -> Measured:
    """Greedy decoding of ``held``'s prompts with ``drafter`` at ``draft_max``, each output checked
    against the target alone's (``reference_outputs``)."""
    steps = tokens = drafted = accepted = 0
    lossless = True
    max_tokens = max(len(r) for r in reference)
    with Llama(
        str(target), draft=str(drafter), n_ctx=_n_ctx(held, max_tokens), draft_max=draft_max, n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
    ) as llm:  # fmt: skip
        for i, want in enumerate(reference):
            res = llm.generate(_prompt(held, i), max_tokens=len(want), temperature=0.0, ignore_eos=True)
            lossless &= list(res.tokens) == want
            steps += res.stats.n_steps
            tokens += len(res.tokens)
            drafted += res.stats.n_drafted
            accepted += res.stats.n_accepted
    return Measured(
        tau=tokens / max(1, steps),
        acceptance=accepted / max(1, drafted),
        lossless=lossless,
        n_tokens=tokens,
        n_steps=steps,
    )
