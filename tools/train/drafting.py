"""Drafter data and training: the target's own greedy continuations of
training-text prompts, then DFlash block training on them.

Prompts are PROMPT_LEN tokens (pair v1) or, with `context_max`, of lengths
spread log-uniformly up to it (pair v2), so the drafter's anchors sit at
every context length it must serve."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .models import Drafter, Target

TAPS = (1, 2, 3)  # llama.cpp ids: inputs of target layers 1..3 (= outputs of layers 0..2)
BLOCK = 8
GAMMA = 4.0  # slot-loss decay for B = 8 (DFlash paper)
PROMPT_LEN = 64
CONT_LEN = 96
TOKEN_BUDGET = 16384  # context tokens per drafter step (long sequences: fewer per batch)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- continuations -------------------------------------------------------------------------


def prompt_lengths(n: int, context_max: int, rng: np.random.Generator, dist: str = "log-uniform") -> np.ndarray:
    """Prompt lengths from PROMPT_LEN to context_max - CONT_LEN: log-uniform (as
    many prompts per doubling) or uniform (as many per token: most of them long)."""
    if context_max <= PROMPT_LEN + CONT_LEN:
        return np.full(n, PROMPT_LEN)
    hi = context_max - CONT_LEN
    if dist == "uniform":
        return rng.integers(PROMPT_LEN, hi + 1, n).astype(np.int64)
    return np.exp(rng.uniform(np.log(PROMPT_LEN), np.log(hi), n)).astype(np.int64)


def stage_continuations(out: Path, n_prompts: int, seed: int, context_max: int = 0,
                        dist: str = "log-uniform") -> None:
    """sequences.npz: `flat` tokens, `offsets` (n+1) and `prompt_lens` (n)."""
    if (out / "sequences.npz").exists():
        return
    from pydflash import Llama

    data = np.load(out / "train.npy")
    rng = np.random.default_rng(seed + 1)
    lens = prompt_lengths(n_prompts, context_max, rng, dist)
    seqs: list[list[int]] = []
    t0 = time.time()
    with Llama(out / "target.gguf", n_ctx=int(lens.max()) + CONT_LEN + 16) as llm:
        for i, n in enumerate(lens):
            s = int(rng.integers(0, len(data) - n))
            prompt = data[s : s + n].tolist()
            seqs.append(prompt + llm.generate(prompt, max_tokens=CONT_LEN, ignore_eos=True).tokens)
            if (i + 1) % 250 == 0:
                log(f"continuations {i + 1}/{n_prompts} ({time.time() - t0:.0f} s)")
    offsets = np.cumsum([0] + [len(x) for x in seqs])
    np.savez(out / "sequences.npz", flat=np.concatenate(seqs).astype(np.int32), offsets=offsets, prompt_lens=lens,
             dist=np.array(dist))


def load_sequences(out: Path) -> tuple[list[torch.Tensor], np.ndarray]:
    z = np.load(out / "sequences.npz")
    off = z["offsets"]
    flat = torch.from_numpy(z["flat"].astype(np.int64))
    return [flat[off[i] : off[i + 1]] for i in range(len(off) - 1)], z["prompt_lens"]


# -- batches -------------------------------------------------------------------------------


class Examples:
    """Sequences with their frozen target features (F16), batched by similar length."""

    def __init__(self, target: Target, seqs: list[torch.Tensor], prompt_lens: np.ndarray):
        self.seqs, self.prompt_lens = seqs, prompt_lens
        with torch.no_grad():
            self.feats = [target(s.unsqueeze(0), TAPS)[1][0].half() for s in seqs]
        self.order = np.argsort([len(s) for s in seqs], kind="stable")

    def __len__(self) -> int:
        return len(self.seqs)

    def batch_size(self, i: int) -> int:
        return int(np.clip(TOKEN_BUDGET // len(self.seqs[self.order[i]]), 2, 16))

    def batch_at(self, i: int) -> list[int]:
        """Indices of the batch that starts at rank i of the length order."""
        n = self.batch_size(i)
        start = max(0, min(i, len(self.order) - n))
        return self.order[start : start + n].tolist()

    def tensors(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
        s = max(len(self.seqs[i]) for i in idx)
        toks = torch.zeros(len(idx), s, dtype=torch.int64)
        feats = torch.zeros(len(idx), s, self.feats[0].shape[-1])
        for r, i in enumerate(idx):
            toks[r, : len(self.seqs[i])] = self.seqs[i]
            feats[r, : len(self.seqs[i])] = self.feats[i].float()
        ends = np.array([len(self.seqs[i]) for i in idx])
        return toks, feats, self.prompt_lens[idx], ends


def block_batch(seqs: torch.Tensor, prompt_lens: np.ndarray, ends: np.ndarray, n_anchor: int,
                rng: np.random.Generator):
    """Anchors, block tokens/positions, labels and the attention mask for a batch
    (each row's anchors lie in its own continuation; padding is never attended)."""
    b, s = seqs.shape
    anchors = np.sort(np.stack([rng.choice(np.arange(p - 1, e - BLOCK + 1), n_anchor, replace=False)
                                for p, e in zip(prompt_lens, ends)]), 1)
    anchors = torch.from_numpy(anchors)  # (B, A)
    pos = (anchors.unsqueeze(-1) + torch.arange(BLOCK)).reshape(b, -1)  # (B, A*BLOCK)
    labels = torch.gather(seqs, 1, pos)  # x_{a+k}
    tokens = torch.zeros_like(labels)
    tokens.view(b, n_anchor, BLOCK)[:, :, 0] = labels.view(b, n_anchor, BLOCK)[:, :, 0]
    n = n_anchor * BLOCK
    ctx_ok = torch.arange(s).view(1, 1, s) < anchors.repeat_interleave(BLOCK, 1).unsqueeze(-1)  # kv_pos < anchor
    blk_id = torch.arange(n) // BLOCK
    self_ok = (blk_id.view(-1, 1) == blk_id.view(1, -1)).expand(b, n, n)
    mask = torch.cat([ctx_ok, self_ok], -1).unsqueeze(1)  # (B,1,N,S+N)
    return tokens, pos, labels, mask


def drafter_loss(model, target, feats, seqs, prompt_lens, ends, n_anchor, w, rng, mask_id):
    tokens, pos, labels, mask = block_batch(seqs, prompt_lens, ends, n_anchor, rng)
    tokens = torch.where(torch.arange(tokens.shape[1]) % BLOCK == 0, tokens, torch.full_like(tokens, mask_id))
    h = model(target, feats, tokens, pos, mask)
    keep = torch.arange(h.shape[1]) % BLOCK > 0  # slot 0 (the anchor) has no loss
    logits = target.head(h[:, keep])  # (B, A*(BLOCK-1), V)
    lab = labels[:, keep]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1), reduction="none")
    ww = w.repeat(n_anchor).repeat(h.shape[0])
    loss = (ce * ww).sum() / ww.sum()
    with torch.no_grad():
        hit = (logits.argmax(-1) == lab).float().view(h.shape[0], n_anchor, BLOCK - 1)
    return loss, hit


def slot_accuracy(hits: list[torch.Tensor]) -> np.ndarray:
    """Accuracy of slot k given all earlier slots right (what verification accepts)."""
    hit = torch.cat([h.reshape(-1, BLOCK - 1) for h in hits])
    prefix = torch.cumprod(hit, -1)
    return np.array([prefix[:, k].sum().item() / max(1.0, prefix[:, k - 1].sum().item() if k else len(hit))
                     for k in range(BLOCK - 1)])


def tau_estimate(acc: np.ndarray) -> float:
    return float(1 + sum(np.prod(acc[: k + 1]) for k in range(len(acc))))


# -- training ------------------------------------------------------------------------------


def stage_drafter(out: Path, load_target, optimize, n_layer: int, minutes: float, seed: int, mask_id: int,
                  resume: bool = False, steps: int | None = None, init: Path | None = None) -> None:
    """Train (or with `resume`, continue training) the drafter; `init` (a drafter
    GGUF) starts from an earlier pair's drafter."""
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
    seqs, plens = load_sequences(out)
    n_val = min(200, len(seqs) // 10)
    log("drafter: extracting target features")
    val, train = Examples(target, seqs[:n_val], plens[:n_val]), Examples(target, seqs[n_val:], plens[n_val:])
    model = Drafter(target.c, len(TAPS), n_layer)
    if prev is not None:
        model.load_state_dict(prev["state"])
    elif init is not None:
        from .warmstart import load_into

        load_into(model, init)
        log(f"drafter: warm start from {init}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    w = torch.exp(-(torch.arange(1, BLOCK) - 1) / GAMMA)
    rng = np.random.default_rng(seed)

    def loss_fn() -> torch.Tensor:
        toks, feats, pl, ends = train.tensors(train.batch_at(int(rng.integers(0, len(train)))))
        return drafter_loss(model, target, feats, toks, pl, ends, 16, w, rng, mask_id)[0]

    t0 = time.time()
    step, losses = optimize(model, opt, loss_fn, 1e-3, 50, minutes, steps, "drafter")
    model.eval()
    acc = validate(model, target, val, w, mask_id)
    log(f"drafter: val per-slot accuracy {np.round(acc, 3).tolist()}, offline tau ~ {tau_estimate(acc):.2f}")
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    done = (prev["steps"] if prev else 0) + step
    secs = (prev["seconds"] if prev else 0.0) + time.time() - t0
    torch.save({"state": model.state_dict(), "n_layer": n_layer, "steps": done,
                "runs": (prev or {}).get("runs", 1) + (1 if prev else 0),
                "train_loss": float(np.mean(losses[-100:])), "val_slot_acc": acc.tolist(),
                "tau_offline": tau_estimate(acc), "seconds": secs, "init": str(init) if init else None,
                "n_sequences": len(seqs), "context_max": int(plens.max()) + CONT_LEN,
                "context_dist": context_dist(out)}, out / "drafter.pt")


def context_dist(out: Path) -> str:
    """How the drafter prompts' lengths spread (runs before the option: log-uniform)."""
    z = np.load(out / "sequences.npz")
    return str(z["dist"]) if "dist" in z.files else "log-uniform"


@torch.no_grad()
def validate(model: Drafter, target: Target, val: Examples, w: torch.Tensor, mask_id: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    hits, i = [], 0
    while i < len(val):
        idx = val.order[i : i + val.batch_size(i)].tolist()
        toks, feats, pl, ends = val.tensors(idx)
        hits.append(drafter_loss(model, target, feats, toks, pl, ends, 16, w, rng, mask_id)[1])
        i += len(idx)
    return slot_accuracy(hits)
