"""tau measured online: the drafter as it stands, written to a GGUF, drafting for
the target in pydflash's own engine on held-out prompts at a pinned draft length.
Offline slot accuracy can read 0.99 while real acceptance is 0.12 (a wrong mask,
block size or layer list trains "fine"); this is the figure that counts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..llama import Llama
from .data import Chunk

__all__ = ["Measured", "measure_tau"]


@dataclasses.dataclass(frozen=True)
class Measured:
    """One online measurement: tau (tokens per target pass), acceptance, and whether every
    output equalled the target's own greedy reply."""

    tau: float
    acceptance: float
    lossless: bool
    n_tokens: int
    n_steps: int


def measure_tau(
    target: Path,
    drafter: Path,
    held: Chunk,
    *,
    draft_max: int,
    max_tokens: int,
    n_threads: int,
    n_gpu_layers: int = 0,
) -> Measured:
    """Greedy decoding of ``held``'s prompts with ``drafter`` at ``draft_max``; the outputs are
    checked against the target's replies stored with them (made by the target alone)."""
    n_ctx = int(max(held.offsets[i + 1] - held.offsets[i] for i in range(len(held)))) + max_tokens + 16
    steps = tokens = drafted = accepted = 0
    lossless = True
    with Llama(
        str(target), draft=str(drafter), n_ctx=n_ctx, draft_max=draft_max, n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
    ) as llm:  # fmt: skip
        for i in range(len(held)):
            seq = held.sequence(i).tolist()
            p = int(held.prompt_lens[i])
            want = seq[p:][:max_tokens]
            res = llm.generate(seq[:p], max_tokens=len(want), temperature=0.0, ignore_eos=True)
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
