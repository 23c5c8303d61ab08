"""``pydflash demo``: DFlash next to the target alone on the embedded pair."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import PyDFlashError
from ..llama import Llama
from .common import DRAFT_MAX_HELP, add_common, llama_options


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "demo",
        help="DFlash vs the target alone on a built-in pair, no arguments needed",
        description="Run the embedded trained pair (a Python-code target and its DFlash "
        "drafter) with DFlash and with the target alone on a few code prompts; "
        "print the text, tokens/s of both, the speed-up, tau (tokens per target "
        "pass), the acceptance rate and the per-step acceptance. Both first run one "
        "untimed generation of another prompt (a warm-up).",
    )
    d.add_argument("--prompt", action="append", help="prompt (repeatable; default: built-in prompts)")
    d.add_argument("--max-tokens", type=int, default=96, help="tokens per prompt (default: %(default)s)")
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
        from .. import testing  # the tiny random pair needs gguf + numpy

        tp, dp = testing.write_pair(workdir, prefix="demo")
        return str(tp), str(dp), "embedded pair missing: tiny random-weight pair (acceptance near zero)"


def _piece(llm: Llama, tokens: Sequence[int]) -> str:
    return repr(llm.detokenize(list(tokens)).decode("utf-8", errors="replace"))[1:-1]


def run(a: argparse.Namespace) -> int:
    prompts = a.prompt or list(DEMO_PROMPTS)
    with tempfile.TemporaryDirectory(prefix="pydflash-demo-") as td:
        target, draft, what = _demo_pair(Path(td))
        print(what)
        if a.pad_ffn:
            from ..testing.padding import pad_ffn

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
            tot_spec = tot_base = 0.0
            n_tok = n_steps = n_drafted = n_accepted = 0
            for prompt in prompts:
                rb = base.generate(prompt, max_tokens=a.max_tokens, ignore_eos=True)
                rs = spec.generate(prompt, max_tokens=a.max_tokens, ignore_eos=True)
                tot_base += rb.stats.decode_seconds
                tot_spec += rs.stats.decode_seconds
                n_tok += len(rs.tokens)
                n_steps += rs.stats.n_steps
                n_drafted += rs.stats.n_drafted
                n_accepted += rs.stats.n_accepted
                print("\n" + "=" * 72)
                print(prompt + rs.text)
                print("-" * 72)
                print(f"identical to the target alone: {rs.tokens == rb.tokens}")
                print(f"target alone: {rb.stats.decode_tokens_per_second:8.1f} tok/s")
                print(
                    f"DFlash:       {rs.stats.decode_tokens_per_second:8.1f} tok/s   "
                    f"speed-up {rb.stats.decode_seconds / max(rs.stats.decode_seconds, 1e-9):.2f}x   "
                    f"tau {rs.stats.mean_accepted_length:.2f}   acceptance {rs.stats.acceptance_rate:.3f}"
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
            print("\n" + "=" * 72)
            print(
                f"overall: speed-up {tot_base / max(tot_spec, 1e-9):.2f}x, "
                f"tau {n_tok / max(n_steps, 1):.2f} tokens per target pass, "
                f"acceptance {n_accepted / max(n_drafted, 1):.3f}"
            )
    return 0
