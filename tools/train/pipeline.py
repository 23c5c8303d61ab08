"""One command: corpus -> tokenizer -> target -> drafter (pydflash.train: the
target's own continuations, its features, training, the GGUF) -> evaluation.
Every stage caches its output under --out and is skipped when that output
exists (delete a file to redo its stage).

    pip install ".[train]"
    python tools/train_pair.py --out build/train --install src/pydflash/models
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import bpe, corpus
from .drafting import log, stage_drafter
from .models import Config, Target
from .warmstart import load_into

# -- data -------------------------------------------------------------------------------

def encode_split(tok, files: list[Path], eos: int) -> np.ndarray:
    ids: list[int] = []
    for p in files:
        ids += tok.encode(corpus.read(p)).ids
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def stage_tokenizer(out: Path, vocab: int) -> None:
    if (out / "tokenizer.json").exists():
        return
    train, held = corpus.split()
    log(f"corpus: {len(train)} train files, {len(held)} held-out files")
    tok = bpe.train((corpus.read(p) for p in train), vocab, out / "tokenizer.json")
    eos = tok.token_to_id(bpe.EOS)
    np.save(out / "train.npy", encode_split(tok, train, eos))
    np.save(out / "heldout.npy", encode_split(tok, held, eos))
    (out / "heldout_files.json").write_text(json.dumps([str(p) for p in held]))


def stage_splits_from_gguf(out: Path, target: Path) -> None:
    """The corpus's splits in the tokens of an existing target GGUF (llama.cpp's tokenizer; the
    target kept as it is needs no tokenizer of its own): train.npy, heldout.npy, and target.gguf
    copied byte for byte."""
    if (out / "heldout.npy").exists():
        return
    import shutil

    from pydflash import Llama

    train, held = corpus.split()
    with Llama(target, n_ctx=256) as llm:
        eos = llm.token_eos()
        for name, files in (("train", train), ("heldout", held)):
            ids: list[int] = []
            for p in files:
                ids += llm.tokenize(corpus.read(p), add_bos=False, special=False) + [eos]
            np.save(out / f"{name}.npy", np.asarray(ids, dtype=np.int32))
    (out / "heldout_files.json").write_text(json.dumps([str(p) for p in held]))
    shutil.copyfile(target, out / "target.gguf")
    log(f"corpus: {len(train)} train files, {len(held)} held-out files, in {target.name}'s tokens")


# -- target -------------------------------------------------------------------------------

def batches(data: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - seq - 1, batch)
        x = np.stack([data[s: s + seq + 1] for s in starts]).astype(np.int64)
        yield torch.from_numpy(x[:, :-1]), torch.from_numpy(x[:, 1:])


def cosine_lr(step: int, total: int, peak: float, warm: int) -> float:
    if step < warm:
        return peak * (step + 1) / warm
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / max(1, total - warm))))


def optimize(model, opt, loss_fn, peak_lr: float, warm: int, minutes: float, steps: int | None,
             what: str) -> tuple[int, list[float]]:
    """AdamW steps with warmup + cosine and gradient clipping. Time-boxed
    (the step budget is measured on the first 20 steps) unless `steps` is given."""
    t0, step, total = time.time(), 0, 10**9 if steps is None else steps
    losses: list[float] = []
    while step < total:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, total, peak_lr, warm)
        loss = loss_fn()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step == 20 and steps is None:
            total = int(minutes * 60 / ((time.time() - t0) / 20))
            log(f"{what}: {total} steps fit in {minutes} min")
        if step % 100 == 0:
            log(f"{what} step {step}/{total} loss {np.mean(losses[-100:]):.3f}")
    return step, losses


def stage_target(out: Path, cfg: Config, minutes: float, seed: int, steps: int | None = None, *, seq: int = 256,
                 bs: int = 16, peak_lr: float = 2e-3, init: Path | None = None) -> None:
    """Train the target on windows of `seq` tokens; `init` (a target GGUF)
    continues an earlier pair's target instead of starting from scratch."""
    if (out / "target.pt").exists():
        return
    torch.manual_seed(seed)
    model = Target(cfg)
    if init is not None:
        load_into(model, init)
        log(f"target: warm start from {init}")
    data = np.load(out / "train.npy")
    held = np.load(out / "heldout.npy")
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    data_iter = batches(data, bs, seq, rng)

    def loss_fn() -> torch.Tensor:
        x, y = next(data_iter)
        logits, _ = model(x)
        return F.cross_entropy(logits.reshape(-1, cfg.n_vocab), y.reshape(-1))

    t0 = time.time()
    if steps == 0 and init is None:
        raise SystemExit("--target-steps 0 keeps the --target-init target as it is: give --target-init")
    step, losses = optimize(model, opt, loss_fn, peak_lr, 100 if init is None else 30, minutes, steps,
                            f"target ({bs} x {seq} tokens/step)")
    model.eval()
    held_loss = eval_loss(model, held, cfg, n=max(2, 32 * 256 // seq), seq=seq)
    train_loss = float(np.mean(losses[-100:])) if losses else float("nan")
    log(f"target: train loss {train_loss:.3f}, held-out loss {held_loss:.3f}")
    # round to the exported precision so torch and GGUF compute the same model
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    torch.save({"state": model.state_dict(), "cfg": cfg.__dict__, "steps": step,
                "train_loss": train_loss, "heldout_loss": held_loss,
                "seconds": time.time() - t0, "tokens": step * seq * bs, "seq": seq, "batch": bs,
                "init": str(init) if init else None}, out / "target.pt")


@torch.no_grad()
def eval_loss(model: Target, data: np.ndarray, cfg: Config, n: int = 32, seq: int = 256) -> float:
    rng = np.random.default_rng(123)
    x, y = next(batches(data, n, seq, rng))
    logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, cfg.n_vocab), y.reshape(-1)).item()


def load_target(out: Path) -> tuple[Target, dict]:
    ck = torch.load(out / "target.pt", weights_only=False)
    model = Target(Config(**ck["cfg"]))
    model.load_state_dict(ck["state"])
    model.eval()
    return model, ck


# -- export ------------------------------------------------------------------------------

def hparams(cfg: Config, n_layer: int):
    from pydflash.gguf_writers import Hparams

    return Hparams(cfg.n_ctx, cfg.n_embd, n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff,
                   cfg.rope_theta, cfg.rms_eps)


def stage_export_target(out: Path) -> None:
    if (out / "target.gguf").exists():
        return
    from pydflash.gguf_writers import write_qwen3_gguf

    model, _ = load_target(out)
    tok = bpe.to_gguf_tokenizer(out / "tokenizer.json")
    write_qwen3_gguf(out / "target.gguf", hparams(model.c, model.c.n_layer), tok, model.gguf_tensors(),
                     name="pydflash stdlib-code target (qwen3, 5M)")
    log(f"target.gguf: {(out / 'target.gguf').stat().st_size / 1e6:.1f} MB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the embedded target + DFlash drafter pair.")
    ap.add_argument("--out", type=Path, default=Path("build/train"))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--target-minutes", type=float, default=30.0)
    ap.add_argument("--drafter-minutes", type=float, default=20.0)
    ap.add_argument("--drafter-layers", type=int, default=1)
    ap.add_argument("--drafter-lr", type=float,
                    help="the drafter's peak learning rate (default: train_drafter's; lower for --drafter-init)")
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target-steps", type=int,
                    help="exact step count instead of --target-minutes (0: keep --target-init as it is)")
    ap.add_argument("--drafter-steps", type=int, help="exact step count instead of --drafter-minutes")
    ap.add_argument("--drafter-resume", action="store_true",
                    help="continue a killed drafter run where it stopped (pydflash train-drafter --resume)")
    ap.add_argument("--target-seq", type=int, default=256, help="target training window (tokens)")
    ap.add_argument("--target-batch", type=int, default=16, help="windows per target step")
    ap.add_argument("--target-lr", type=float, default=2e-3, help="peak learning rate of the target")
    ap.add_argument("--rope-theta", type=float, default=10000.0, help="RoPE base of both models")
    ap.add_argument("--context-max", type=int, default=4096,
                    help="drafter prompts from 16 tokens up to this (half of them 16-128 tokens)")
    ap.add_argument("--target-init", type=Path, help="continue this target GGUF instead of starting from scratch")
    ap.add_argument("--drafter-init", type=Path, help="start the drafter from this drafter GGUF")
    ap.add_argument("--install", type=Path, help="copy the pair + model card into this folder")
    ap.add_argument("--compare", type=Path, metavar="DRAFTER",
                    help="also measure this drafter beside the new one per context length (JSON to --compare-json)")
    ap.add_argument("--compare-json", type=Path, default=Path("benchmarks/results/embedded-drafter-contexts.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    random.seed(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = Config(n_vocab=a.vocab, n_ctx=max(4096, a.target_seq), rope_theta=a.rope_theta)
    t0 = time.time()
    if a.target_steps == 0 and a.target_init is not None:  # the target as it is: its own tokens
        stage_splits_from_gguf(a.out, a.target_init)
    else:
        stage_tokenizer(a.out, a.vocab)
    stage_target(a.out, cfg, a.target_minutes, a.seed, a.target_steps, seq=a.target_seq, bs=a.target_batch,
                 peak_lr=a.target_lr, init=a.target_init)
    stage_export_target(a.out)
    stage_drafter(a.out, a)
    log(f"pipeline done in {(time.time() - t0) / 60:.1f} min")
    if a.compare:
        import shutil
        import sys

        from .evaluate import compare_drafters

        old = a.out / "drafter-before.gguf"
        shutil.copyfile(a.compare, old)  # the install below may replace the file it names
        rows = compare_drafters(a.out, a.out / "target.gguf", {"before": old, "new": a.out / "drafter.gguf"})
        a.compare_json.write_text(json.dumps({"command": "python tools/train_pair.py " + " ".join(sys.argv[1:]),
                                              "draft_max": 7, "prompts_per_length": 16, "max_tokens": 128,
                                              "contexts": rows}, indent=1))
    if a.install:
        from .evaluate import install
        install(a.out, a.install)
    return 0
