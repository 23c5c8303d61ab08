"""``pydflash demo``: DFlash next to the target alone on the embedded pair."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import PyDFlashError
from ..llama import Llama
from ..results import GenerationResult
from .common import DRAFT_MAX_HELP, add_common, llama_options


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "demo",
        help="DFlash vs the target alone on a built-in pair, no arguments needed",
        description="Run the embedded trained pair (a Python-code target and its DFlash "
        "drafter) with DFlash and with the target alone on a few code prompts, "
        "interleaved over --repeats runs; print the text, tokens/s of both, the "
        "speed-up with its spread over the repeats, tau (tokens per target pass), the "
        "acceptance rate and the per-step acceptance, and a warning when the load "
        "average is above the core count (timings are then noise). Both first run one "
        "untimed generation of another prompt (a warm-up).",
    )
    d.add_argument("--prompt", action="append", help="prompt (repeatable; default: built-in prompts)")
    d.add_argument("--max-tokens", type=int, default=96, help="tokens per prompt (default: %(default)s)")
    d.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="N",
        help="timed runs of each prompt by each engine, interleaved (which goes first alternates); the "
        "speed-up is their median with its range (default: %(default)s)",
    )
    d.add_argument("--draft-max", type=int, default=None, help=DRAFT_MAX_HELP)
    d.add_argument(
        "--pad-ffn",
        type=int,
        default=16384,
        metavar="N",
        help="decode with a memory-bound copy of the target whose FFN is zero-padded to N "
        "(identical outputs; like a large model, its decode is bound by reading weights, "
        "which is what DFlash speeds up); 0 = the small target as is (default: %(default)s)",
    )
    add_common(d)


DEMO_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n",
    "class Stack:\n    def __init__(self):\n",
    "    for i in range(len(items)):\n",
)


WARMUP_PROMPT = "def add(a, b):\n"


def _demo_pair(workdir: Path) -> tuple[str, str, str]:
    from ..embedded import embedded_pair

    try:
        t, d = embedded_pair()
        return t, d, "embedded pair: trained Python-code qwen3 target + DFlash drafter (models/MODEL_CARD.md)"
    except PyDFlashError:
        from ..gguf_writers import write_pair  # the tiny random pair needs gguf + numpy

        tp, dp = write_pair(workdir, prefix="demo")
        return str(tp), str(dp), "embedded pair missing: tiny random-weight pair (acceptance near zero)"


def _piece(llm: Llama, tokens: Sequence[int]) -> str:
    return repr(llm.detokenize(list(tokens)).decode("utf-8", errors="replace"))[1:-1]


def busy_warning(load: float | None = None, cores: int | None = None) -> str | None:
    """One line when the 1-minute load average is above the core count (other work shares
    the CPU, so timings are noise); None otherwise, or where the OS gives no load average."""
    n = cores or os.cpu_count() or 1
    if load is None:
        if not hasattr(os, "getloadavg"):
            return None
        load = os.getloadavg()[0]
    if load <= n:
        return None
    return (
        f"warning: the load average ({load:.1f}) is above the {n} cores: other work shares the CPU and the "
        "speed-up below is not a clean measurement"
    )


def spread(ratios: Sequence[float]) -> str:
    """A speed-up as its median and range over interleaved repeats."""
    med = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{med:.2f}x (one run)"
    return f"{med:.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x over {len(ratios)} interleaved repeats)"


def _interleaved(
    base: Llama, spec: Llama, prompt: str, max_tokens: int, repeats: int
) -> tuple[list[GenerationResult], list[GenerationResult]]:
    """Each engine's runs of ``prompt``, alternating which goes first, so that a change in
    the machine's load falls on both alike."""
    out: dict[int, list[GenerationResult]] = {id(base): [], id(spec): []}
    for r in range(repeats):
        for llm in (base, spec) if r % 2 == 0 else (spec, base):
            out[id(llm)].append(llm.generate(prompt, max_tokens=max_tokens, ignore_eos=True))
    return out[id(base)], out[id(spec)]


def _show(prompt: str, spec: Llama, rbs: list[GenerationResult], rss: list[GenerationResult]) -> None:
    rb, rs = rbs[0], rss[0]
    print("\n" + "=" * 72)
    print(prompt + rs.text)
    print("-" * 72)
    print(f"identical to the target alone: {all(r.tokens == rb.tokens for r in rss + rbs)}")
    print(f"target alone: {statistics.median(r.stats.decode_tokens_per_second for r in rbs):8.1f} tok/s")
    ratios = [b.stats.decode_seconds / max(s.stats.decode_seconds, 1e-9) for b, s in zip(rbs, rss, strict=True)]
    print(
        f"DFlash:       {statistics.median(r.stats.decode_tokens_per_second for r in rss):8.1f} tok/s   "
        f"speed-up {spread(ratios)}   tau {rs.stats.mean_accepted_length:.2f}   "
        f"acceptance {rs.stats.acceptance_rate:.3f}"
    )
    print("steps: [accepted drafts] ~first rejected draft~ +the target's own token")
    for st in rs.stats.steps[:10]:
        rej = st.drafted[st.n_accepted : st.n_accepted + 1]
        print(
            f"  {st.n_accepted}/{st.n_drafted}  [{_piece(spec, st.drafted[: st.n_accepted])}]"
            + (f" ~{_piece(spec, rej)}~" if rej else "")
            + f" +{_piece(spec, st.tokens[-1:])}"
        )
    if len(rs.stats.steps) > 10:
        print(f"  ... {len(rs.stats.steps) - 10} more steps")


def run(a: argparse.Namespace) -> int:
    if a.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {a.repeats}")
    prompts = a.prompt or list(DEMO_PROMPTS)
    warned = busy_warning()  # before the demo's own threads add to the load
    if warned:
        print(warned)
    with tempfile.TemporaryDirectory(prefix="pydflash-demo-") as td:
        target, draft, what = _demo_pair(Path(td))
        print(what)
        if a.pad_ffn:
            from ..gguf_writers.padding import pad_ffn

            target = str(pad_ffn(target, Path(td) / "target-padded.gguf", a.pad_ffn))
            print(
                f"target: memory-bound copy, FFN zero-padded to {a.pad_ffn} (same outputs; --pad-ffn 0 for "
                f"the small target as is)"
            )
        common = llama_options(a)
        with Llama(target, draft=draft, draft_max=a.draft_max, **common) as spec, Llama(target, **common) as base:
            # One whole untimed generation each: the first timing is then no cold start, neither
            # the machine's nor the adaptive length's (it learns from a generation's later
            # positions too, not only its first ones, where drafters keep least).
            for llm in (base, spec):
                llm.generate(WARMUP_PROMPT, max_tokens=a.max_tokens, ignore_eos=True)
            runs = []
            for p in prompts:
                runs.append(_interleaved(base, spec, p, a.max_tokens, a.repeats))
                _show(p, spec, *runs[-1])
    _overall(runs, a.repeats)
    return 0


def _overall(runs: list[tuple[list[GenerationResult], list[GenerationResult]]], repeats: int) -> None:
    """The speed-up of each repeat over all prompts, as a spread; tau and acceptance over all."""
    ratios = [
        sum(rbs[r].stats.decode_seconds for rbs, _ in runs)
        / max(sum(rss[r].stats.decode_seconds for _, rss in runs), 1e-9)
        for r in range(repeats)
    ]
    spec = [s for _, rss in runs for s in rss]
    n_tok = sum(len(s.tokens) for s in spec)
    n_steps = sum(s.stats.n_steps for s in spec)
    drafted, accepted = sum(s.stats.n_drafted for s in spec), sum(s.stats.n_accepted for s in spec)
    print("\n" + "=" * 72)
    print(
        f"overall: speed-up {spread(ratios)}, tau {n_tok / max(n_steps, 1):.2f} tokens per target pass, "
        f"acceptance {accepted / max(drafted, 1):.3f}"
    )
