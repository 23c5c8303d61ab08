"""One command: corpus -> tokenizer -> target -> continuations -> drafter ->
GGUF pair -> evaluation. Every stage caches its output under --out and is
skipped when that output exists (delete a file to redo its stage).

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
from .models import Config, Drafter, Target

TAPS = (1, 2, 3)        # llama.cpp ids: inputs of target layers 1..3 (= outputs of layers 0..2)
BLOCK = 8
GAMMA = 4.0             # slot-loss decay for B = 8 (DFlash paper)
PROMPT_LEN = 64
CONT_LEN = 96


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


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
    t0, step, total = time.time(), 0, steps or 10**9
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


def stage_target(out: Path, cfg: Config, minutes: float, seed: int, steps: int | None = None) -> None:
    if (out / "target.pt").exists():
        return
    torch.manual_seed(seed)
    model = Target(cfg)
    data = np.load(out / "train.npy")
    held = np.load(out / "heldout.npy")
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    seq, bs = 256, 16
    data_iter = batches(data, bs, seq, rng)

    def loss_fn() -> torch.Tensor:
        x, y = next(data_iter)
        logits, _ = model(x)
        return F.cross_entropy(logits.reshape(-1, cfg.n_vocab), y.reshape(-1))

    t0 = time.time()
    step, losses = optimize(model, opt, loss_fn, 2e-3, 100, minutes, steps, f"target ({seq * bs} tokens/step)")
    model.eval()
    held_loss = eval_loss(model, held, cfg)
    log(f"target: train loss {np.mean(losses[-100:]):.3f}, held-out loss {held_loss:.3f}")
    # round to the exported precision so torch and GGUF compute the same model
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    torch.save({"state": model.state_dict(), "cfg": cfg.__dict__, "steps": step,
                "train_loss": float(np.mean(losses[-100:])), "heldout_loss": held_loss,
                "seconds": time.time() - t0, "tokens": step * seq * bs}, out / "target.pt")


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
    from pydflash.testing import Hparams

    return Hparams(cfg.n_ctx, cfg.n_embd, n_layer, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff,
                   cfg.rope_theta, cfg.rms_eps)


def stage_export_target(out: Path) -> None:
    if (out / "target.gguf").exists():
        return
    from pydflash.testing import write_qwen3_gguf

    model, _ = load_target(out)
    tok = bpe.to_gguf_tokenizer(out / "tokenizer.json")
    write_qwen3_gguf(out / "target.gguf", hparams(model.c, model.c.n_layer), tok, model.gguf_tensors(),
                     name="pydflash stdlib-code target (qwen3, 5M)")
    log(f"target.gguf: {(out / 'target.gguf').stat().st_size / 1e6:.1f} MB")


# -- continuations ---------------------------------------------------------------------------

def stage_continuations(out: Path, n_prompts: int, seed: int) -> None:
    if (out / "sequences.npy").exists():
        return
    from pydflash import Llama

    data = np.load(out / "train.npy")
    rng = np.random.default_rng(seed + 1)
    seqs = np.zeros((n_prompts, PROMPT_LEN + CONT_LEN), dtype=np.int32)
    t0 = time.time()
    with Llama(out / "target.gguf", n_ctx=512) as llm:
        for i in range(n_prompts):
            s = int(rng.integers(0, len(data) - PROMPT_LEN))
            prompt = data[s: s + PROMPT_LEN].tolist()
            cont = llm.generate(prompt, max_tokens=CONT_LEN, ignore_eos=True).tokens
            seqs[i] = prompt + cont
            if (i + 1) % 500 == 0:
                log(f"continuations {i + 1}/{n_prompts} ({time.time() - t0:.0f} s)")
    np.save(out / "sequences.npy", seqs)


# -- drafter ------------------------------------------------------------------------------

def block_batch(seqs: torch.Tensor, n_anchor: int, rng: np.random.Generator):
    """Anchors, block tokens/positions, labels and the attention mask for a batch."""
    b, s = seqs.shape
    lo, hi = PROMPT_LEN - 1, s - BLOCK  # predicted tokens a+1.. lie in the continuation
    anchors = np.sort(np.stack([rng.choice(np.arange(lo, hi + 1), n_anchor, replace=False) for _ in range(b)]), 1)
    anchors = torch.from_numpy(anchors)                                   # (B, A)
    offs = torch.arange(BLOCK)
    pos = (anchors.unsqueeze(-1) + offs).reshape(b, -1)                   # (B, A*BLOCK)
    labels = torch.gather(seqs, 1, pos)                                   # x_{a+k}
    tokens = torch.full_like(labels, 0)
    tokens.view(b, n_anchor, BLOCK)[:, :, 0] = labels.view(b, n_anchor, BLOCK)[:, :, 0]
    n = n_anchor * BLOCK
    ctx_ok = torch.arange(s).view(1, 1, s) < anchors.repeat_interleave(BLOCK, 1).unsqueeze(-1)  # kv_pos < anchor
    blk_id = torch.arange(n) // BLOCK
    self_ok = (blk_id.view(-1, 1) == blk_id.view(1, -1)).expand(b, n, n)
    mask = torch.cat([ctx_ok, self_ok], -1).unsqueeze(1)                  # (B,1,N,S+N)
    return tokens, pos, labels, mask


def stage_drafter(out: Path, n_layer: int, minutes: float, seed: int, mask_id: int, resume: bool = False,
                  steps: int | None = None) -> None:
    """Train (or with `resume`, continue training) the drafter for `minutes`."""
    prev = None
    if (out / "drafter.pt").exists():
        if not resume:
            return
        prev = torch.load(out / "drafter.pt", weights_only=False)
        seed += prev["steps"]  # fresh anchors and batches for the continued run
    torch.manual_seed(seed)
    target, _ = load_target(out)
    for p in target.parameters():
        p.requires_grad_(False)
    cfg = target.c
    seqs = torch.from_numpy(np.load(out / "sequences.npy").astype(np.int64))
    n_val = min(200, len(seqs) // 10)
    val, train = seqs[:n_val], seqs[n_val:]
    log("drafter: extracting target features")
    with torch.no_grad():
        feats = torch.cat([target(train[i: i + 64], TAPS)[1] for i in range(0, len(train), 64)])
        vfeats = torch.cat([target(val[i: i + 64], TAPS)[1] for i in range(0, len(val), 64)])
    model = Drafter(cfg, len(TAPS), n_layer)
    if prev is not None:
        model.load_state_dict(prev["state"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    w = torch.exp(-(torch.arange(1, BLOCK) - 1) / GAMMA)
    rng = np.random.default_rng(seed)
    bs, n_anchor = 16, 16

    def loss_fn() -> torch.Tensor:
        idx = rng.integers(0, len(train), bs)
        return drafter_loss(model, target, feats[idx], train[idx], n_anchor, w, rng, mask_id)[0]

    t0 = time.time()
    step, losses = optimize(model, opt, loss_fn, 1e-3, 50, minutes, steps, "drafter")
    model.eval()
    with torch.no_grad():
        _, acc = drafter_loss(model, target, vfeats, val, 16, w, np.random.default_rng(7), mask_id)
    tau_est = 1 + sum(np.prod(acc[: k + 1]) for k in range(len(acc)))  # prefix-acceptance estimate
    log(f"drafter: val per-slot accuracy {np.round(acc, 3).tolist()}, offline tau ~ {tau_est:.2f}")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    done = (prev["steps"] if prev else 0) + step
    secs = (prev["seconds"] if prev else 0.0) + time.time() - t0
    torch.save({"state": model.state_dict(), "n_layer": n_layer, "steps": done, "runs": (prev or {}).get("runs", 1) + (1 if prev else 0),
                "train_loss": float(np.mean(losses[-100:])), "val_slot_acc": acc.tolist(),
                "tau_offline": float(tau_est), "seconds": secs}, out / "drafter.pt")


def drafter_loss(model, target, feats, seqs, n_anchor, w, rng, mask_id):
    tokens, pos, labels, mask = block_batch(seqs, n_anchor, rng)
    tokens = torch.where(torch.arange(tokens.shape[1]) % BLOCK == 0, tokens, torch.full_like(tokens, mask_id))
    h = model(target, feats, tokens, pos, mask)
    slot = torch.arange(h.shape[1]) % BLOCK
    keep = slot > 0                                    # slot 0 (the anchor) has no loss
    logits = target.head(h[:, keep])                   # (B, A*(BLOCK-1), V)
    lab = labels[:, keep]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none")
    ww = w.repeat(n_anchor).repeat(h.shape[0])
    loss = (ce * ww).sum() / ww.sum()
    with torch.no_grad():
        hit = (logits.argmax(-1) == lab).float().view(h.shape[0], n_anchor, BLOCK - 1)
        # accuracy of slot k given all earlier slots right (what verification accepts)
        prefix = torch.cumprod(hit, -1)
        acc = np.array([prefix[..., k].sum().item() / max(1.0, (prefix[..., k - 1].sum().item() if k else hit[..., 0].numel()))
                        for k in range(BLOCK - 1)])
    return loss, acc


def stage_export_drafter(out: Path) -> None:
    if (out / "drafter.gguf").exists():
        return
    from pydflash.testing import write_dflash_gguf

    target, _ = load_target(out)
    ck = torch.load(out / "drafter.pt", weights_only=False)
    model = Drafter(target.c, len(TAPS), ck["n_layer"])
    model.load_state_dict(ck["state"])
    tok = bpe.to_gguf_tokenizer(out / "tokenizer.json")
    write_dflash_gguf(out / "drafter.gguf", hparams(target.c, ck["n_layer"]), tok, model.gguf_tensors(),
                      block_size=BLOCK, target_layers=TAPS, name="pydflash stdlib-code DFlash drafter")
    log(f"drafter.gguf: {(out / 'drafter.gguf').stat().st_size / 1e6:.1f} MB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Train the embedded target + DFlash drafter pair.")
    ap.add_argument("--out", type=Path, default=Path("build/train"))
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--target-minutes", type=float, default=30.0)
    ap.add_argument("--drafter-minutes", type=float, default=20.0)
    ap.add_argument("--drafter-layers", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target-steps", type=int, help="exact step count instead of --target-minutes")
    ap.add_argument("--drafter-steps", type=int, help="exact step count instead of --drafter-minutes")
    ap.add_argument("--drafter-resume", action="store_true",
                    help="continue training an existing drafter.pt for --drafter-minutes more")
    ap.add_argument("--install", type=Path, help="copy the pair + model card into this folder")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    random.seed(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = Config(n_vocab=a.vocab)
    t0 = time.time()
    stage_tokenizer(a.out, a.vocab)
    stage_target(a.out, cfg, a.target_minutes, a.seed, a.target_steps)
    stage_export_target(a.out)
    stage_continuations(a.out, a.prompts, a.seed)
    mask_id = bpe.load(a.out / "tokenizer.json").token_to_id(bpe.MASK)
    if a.drafter_resume and (a.out / "drafter.gguf").exists():
        (a.out / "drafter.gguf").unlink()  # re-export after the continued run
    stage_drafter(a.out, a.drafter_layers, a.drafter_minutes, a.seed, mask_id, resume=a.drafter_resume,
                  steps=a.drafter_steps)
    stage_export_drafter(a.out)
    log(f"pipeline done in {(time.time() - t0) / 60:.1f} min")
    if a.install:
        from .evaluate import install
        install(a.out, a.install)
    return 0
