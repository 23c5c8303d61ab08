"""Measure the trained pair with pydflash, write torch reference numbers for
the parity tests, and install the pair + model card into the package."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from . import bpe
from .drafting import BLOCK, CONT_LEN, log
from .pipeline import load_target

CONTEXTS = (16, 32, 64, 128, 512, 1024, 2048, 4096)  # the card's per-context rows
CONTEXT_PROMPTS = 16  # prompts per context length (the first 6 are pair v2's card's: seed 41)
WINDOWS = (0, 2048, None)  # drafter windows of those rows: the whole context, 2048, pydflash's default

TARGET_NAME = "stdlib-code-target.gguf"
DRAFTER_NAME = "stdlib-code-dflash.gguf"
ROOT = Path(__file__).resolve().parents[2]


def heldout_prompts(out: Path, n: int, length: int, seed: int = 11, allow_eos: bool = False) -> list[list[int]]:
    """Windows of the held-out token stream that contain no end-of-text (long
    windows, `allow_eos`: file boundaries as the target was trained on them)."""
    held = np.load(out / "heldout.npy")
    eos = _eos(out)
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    while len(prompts) < n:
        s = int(rng.integers(0, len(held) - length))
        w = held[s: s + length]
        if allow_eos or eos not in w:
            prompts.append(w.tolist())
    return prompts


def _eos(out: Path) -> int:
    """End-of-text's id: the trained tokenizer's, or the target GGUF's when the run kept the target."""
    if (out / "tokenizer.json").exists():
        return bpe.load(out / "tokenizer.json").token_to_id(bpe.EOS)
    from pydflash import inspect_gguf

    return int(inspect_gguf(out / "target.gguf")["metadata"]["tokenizer.ggml.eos_token_id"])


@torch.no_grad()
def torch_reference(out: Path) -> dict:
    """The target's logits (tools' torch Target) and drafter blocks (pydflash.train's torch Drafter, read
    back from drafter.gguf) on held-out windows: what the parity tests compare pydflash's numbers with."""
    from pydflash.train.model import Drafter
    from pydflash.train.shape import shape_of_drafter
    from pydflash.train.target import frozen_tensors, read_target, read_tensors

    target, _ = load_target(out)
    info = read_target(out / "target.gguf")
    shape = shape_of_drafter(out / "drafter.gguf", info)
    embd, head = frozen_tensors(out / "target.gguf")
    drafter = Drafter(shape, embd, head)
    drafter.load_gguf_tensors(read_tensors(out / "drafter.gguf"))
    drafter.eval()

    logits_ref = []
    for p in heldout_prompts(out, 6, 48, seed=21):
        logits, _ = target(torch.tensor([p]))
        top = torch.topk(logits[0], 5, -1)
        logits_ref.append({"tokens": p, "top_ids": top.indices.tolist(), "top_logits": top.values.tolist()})

    blocks = []
    for ctx in heldout_prompts(out, 24, 40, seed=22):
        # block at anchor position n = len(ctx) - 1: context features of 0..n-1
        n = len(ctx) - 1
        _, feats = target(torch.tensor([ctx[:n]]), shape.target_layers)
        tokens = torch.tensor([[ctx[n]] + [shape.mask_token] * (BLOCK - 1)])
        pos = torch.arange(n, n + BLOCK).unsqueeze(0)
        mask = torch.ones(1, 1, BLOCK, n + BLOCK, dtype=torch.bool)
        lg = drafter.logits(drafter(feats, tokens, pos, mask)[0, 1:])
        top2 = torch.topk(lg, 2, -1)
        blocks.append({"context": ctx, "block": top2.indices[:, 0].tolist(),
                       "margins": (top2.values[:, 0] - top2.values[:, 1]).tolist()})
    return {"logits": logits_ref, "blocks": blocks}


def measure(target: Path, drafter: Path, prompts: list[list[int]], max_tokens: int = 128) -> dict:
    from pydflash import Llama

    rows = {}
    with Llama(target, n_ctx=1024) as base, Llama(target, draft=drafter, n_ctx=1024) as spec:
        refs = [base.generate(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
        base_tps = statistics.median(r.stats.decode_tokens_per_second for r in refs)
        for dm in range(1, BLOCK):
            taus, accs, tps, same = [], [], [], True
            for p, ref in zip(prompts, refs):
                r = spec.generate(p, max_tokens=max_tokens, ignore_eos=True, draft_max=dm)
                same &= r.tokens == ref.tokens
                taus.append(r.stats.mean_accepted_length)
                accs.append(r.stats.acceptance_rate)
                tps.append(r.stats.decode_tokens_per_second)
            rows[dm] = {"tau": statistics.mean(taus), "acceptance": statistics.mean(accs),
                        "decode_tok_s": statistics.median(tps), "identical": same}
    return {"baseline_decode_tok_s": base_tps, "by_draft_max": rows}


@torch.no_grad()
def heldout_loss_at(out: Path, length: int, tail: int = 256, tokens: int = 16384) -> float:
    """Mean loss of the last `tail` tokens of held-out windows of `length` tokens:
    the loss at about `length` tokens of context."""
    target, _ = load_target(out)
    held = np.load(out / "heldout.npy").astype(np.int64)
    rng = np.random.default_rng(31)
    losses = []
    for _ in range(max(2, min(64, tokens // length))):  # 64 windows at most: short lengths need no more
        s = int(rng.integers(0, len(held) - length - 1))
        x = torch.from_numpy(held[s : s + length + 1])
        logits, _ = target(x[None, :-1])
        losses.append(torch.nn.functional.cross_entropy(logits[0, -tail:], x[1:][-tail:]).item())
    return statistics.mean(losses)


def measure_contexts(out: Path, target: Path, drafter: Path, lengths=CONTEXTS, n: int = CONTEXT_PROMPTS,
                     max_tokens: int = 128, windows: tuple[int | None, ...] = (None,)) -> dict:
    """tau and acceptance at draft_max = block - 1 on held-out prompts of each
    length (pydflash, greedy), output checked against the target alone; with
    `windows`, once per drafter window (None: pydflash's default)."""
    from pydflash import Llama

    rows: dict = {}
    for length in lengths:
        prompts = heldout_prompts(out, n, length, seed=41, allow_eos=True)
        n_ctx = length + max_tokens + 64
        row: dict = {"heldout_loss": heldout_loss_at(out, length)}
        with Llama(target, n_ctx=n_ctx) as base:
            refs = [base.generate(p, max_tokens=max_tokens, ignore_eos=True).tokens for p in prompts]
        for win in windows:
            extra = {} if win is None else {"draft_window": win}
            with Llama(target, draft=drafter, n_ctx=n_ctx, **extra) as spec:
                res = [spec.generate(p, max_tokens=max_tokens, ignore_eos=True, draft_max=BLOCK - 1) for p in prompts]
            taus = [r.stats.mean_accepted_length for r in res]
            row[str(win)] = {"tau": statistics.mean(taus), "tau_first6": statistics.mean(taus[:6]),
                             "acceptance": statistics.mean(r.stats.acceptance_rate for r in res),
                             "identical": all(r.tokens == w for r, w in zip(res, refs))}
        rows[str(length)] = row
        log(f"context {length}: {row}")
    return rows


def compare_drafters(out: Path, target: Path, drafters: dict[str, Path], lengths=CONTEXTS,
                     n: int = CONTEXT_PROMPTS, max_tokens: int = 128) -> dict:
    """tau at draft_max = block - 1 of each drafter on the same held-out prompts of each length
    (pydflash, greedy, each output checked against the target alone's), side by side in one run."""
    from pydflash import Llama

    rows: dict = {}
    for length in lengths:
        prompts = heldout_prompts(out, n, length, seed=41, allow_eos=True)
        n_ctx = length + max_tokens + 64
        with Llama(target, n_ctx=n_ctx) as base:
            refs = [base.generate(p, max_tokens=max_tokens, ignore_eos=True).tokens for p in prompts]
        row: dict = {}
        for name, d in drafters.items():
            with Llama(target, draft=d, n_ctx=n_ctx) as spec:
                res = [spec.generate(p, max_tokens=max_tokens, ignore_eos=True, draft_max=BLOCK - 1) for p in prompts]
            row[name] = {"tau": statistics.mean(r.stats.mean_accepted_length for r in res),
                         "acceptance": statistics.mean(r.stats.acceptance_rate for r in res),
                         "identical": all(r.tokens == w for r, w in zip(res, refs))}
        rows[str(length)] = row
        log(f"context {length}: {row}")
    return rows


def install(out: Path, dest: Path, windows: tuple[int | None, ...] = WINDOWS) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "target.gguf", dest / TARGET_NAME)
    shutil.copyfile(out / "drafter.gguf", dest / DRAFTER_NAME)
    log("measuring the pair with pydflash on held-out prompts")
    prompts = heldout_prompts(out, 20, 64)
    m = measure(dest / TARGET_NAME, dest / DRAFTER_NAME, prompts)
    ctx = measure_contexts(out, dest / TARGET_NAME, dest / DRAFTER_NAME, windows=windows)
    (out / "contexts.json").write_text(json.dumps(ctx, indent=1))
    ref = torch_reference(out)
    ref["heldout_prompts"] = prompts
    ref["measured"] = m
    ref["contexts"] = ctx
    data_dir = ROOT / "tests" / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "embedded_reference.json").write_text(json.dumps(ref))
    write_card(out, dest, m, ctx)
    log("installed " + ", ".join(p.name for p in dest.iterdir()))


def _context_table(ctx: dict) -> str:
    wins = [k for k in next(iter(ctx.values())) if k != "heldout_loss"]
    name = {"None": "default window", "0": "no window"}
    head = "| context | held-out loss | " + " | ".join(f"tau ({name.get(w, f'window {w}')})" for w in wins)
    head += " | tau (default window, first 6 prompts) | output identical |\n|---|---|" + "---|" * len(wins) + "---|---|"
    default = "None" if "None" in wins else wins[-1]  # str(None): pydflash's default window
    rows = [f"| {length} | {r['heldout_loss']:.3f} | " + " | ".join(f"{r[w]['tau']:.2f}" for w in wins)
            + f" | {r[default].get('tau_first6', float('nan')):.2f}"
            + f" | {'yes' if all(r[w]['identical'] for w in wins) else 'NO'} |" for length, r in ctx.items()]
    return "\n".join([head, *rows])


def write_card(out: Path, dest: Path, m: dict, ctx: dict) -> None:
    tck = torch.load(out / "target.pt", weights_only=False)
    rep = json.loads((out / "drafter-report.json").read_text())
    c = tck["cfg"]
    t_mb = (dest / TARGET_NAME).stat().st_size / 1e6
    d_mb = (dest / DRAFTER_NAME).stat().st_size / 1e6
    seq, bs = tck.get("seq", 256), tck.get("batch", 16)
    if tck["steps"] == 0:  # --target-steps 0: the init target as it was
        t_train = f"The target of `{tck['init']}`, unchanged (0 steps here)"
    else:
        t_init = f" continuing `{tck['init']}`" if tck.get("init") else " from scratch"
        t_train = (f"{tck['steps']} AdamW steps of {bs} x {seq} tokens{t_init}\n  ({tck['tokens'] / 1e6:.1f}M tokens, "
                   f"{tck['seconds'] / 60:.0f} min): train loss {tck['train_loss']:.3f}")
    shape = rep["shape"]
    rows = "\n".join(
        f"| {dm} | {r['tau']:.2f} | {r['acceptance']:.3f} | {r['decode_tok_s']:.0f} | "
        f"{r['decode_tok_s'] / m['baseline_decode_tok_s']:.2f}x | {'yes' if r['identical'] else 'NO'} |"
        for dm, r in m["by_draft_max"].items())
    (dest / "MODEL_CARD.md").write_text(f"""# Embedded pair: stdlib-code target + DFlash drafter

Trained on this machine by `python tools/train_pair.py` ({time.strftime('%Y-%m-%d')}), fixed seeds, CPU only;
`docs/embedded-pair.md` gives the exact commands.

- **Data**: Python's own standard library source (PSF licence), `*.py` files without tests
  (`site-packages`, `test`, `idle_test`, `lib2to3` excluded), split by file: 95% train
  (3.07M tokens), 5% held-out.
- **Tokenizer**: byte-level BPE, {c['n_vocab']} tokens (GPT-2 pre-tokenizer), `<|endoftext|>` and
  `<|mask|>` specials; llama.cpp reproduces it exactly on every held-out file.
- **Target** (`{TARGET_NAME}`, {t_mb:.1f} MB, F16): qwen3, {c['n_layer']} layers, hidden {c['n_embd']},
  {c['n_head']} heads x {c['head_dim']} ({c['n_head_kv']} KV heads), FFN {c['n_ff']}, untied head, RoPE base
  {c['rope_theta']:g}, trained context {c['n_ctx']}; {sum(v.numel() for v in tck['state'].values()) / 1e6:.1f}M
  parameters. {t_train};
  held-out loss {tck['heldout_loss']:.3f} nats/token (windows of {seq}).
- **Drafter** (`{DRAFTER_NAME}`, {d_mb:.1f} MB, F16): DFlash, {shape['n_layer']} layer{'s' if shape['n_layer'] > 1 else ''}, block size {shape['block_size']},
  target layers {shape['target_layers']} (llama.cpp ids: inputs of those layers), KV injection, target's
  embeddings and head. Trained with `pydflash.train` (`pydflash train-drafter`) on the target's own greedy
  continuations ({CONT_LEN} tokens) of {rep['n_sequences']:,} training-split code windows of 16 to 4,000 tokens
  ({rep['n_tokens']:,} tokens): {rep['steps']} steps ({rep['train_minutes']:.0f} min of training); online tau
  {rep['best_tau']:.2f} at draft_max {rep['draft_max']} on 16 held-out windows.

## Measured with pydflash (20 held-out prompts of 64 tokens, 128 new tokens, temperature 0)

Target alone: {m['baseline_decode_tok_s']:.0f} tok/s (median). Speed-ups are medians on this shared
2-core machine, measured side by side in one run.

| draft_max | tau | acceptance | DFlash tok/s | speed-up | output identical |
|---|---|---|---|---|---|
{rows}

## Per context length ({CONTEXT_PROMPTS} held-out prompts of each length, 128 new tokens, draft_max {BLOCK - 1})

Held-out loss: the last 256 tokens of held-out windows of that length (about that much
context), torch. tau: pydflash, greedy, output compared with the target alone's. The
default window is pydflash's (4096 positions, so it cuts only at 8192). "NO": at least one
prompt's output departs from the target-alone loop's (a near-tie of the target's own logits,
which batching decides either way; `benchmarks/tau_by_context.py` records each one's gap).

{_context_table(ctx)}
""")
