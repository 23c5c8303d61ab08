"""The DFlash training objective (the paper's recipe): random anchors in the
target's reply, each a block ``[x_a, MASK x (B-1)]`` that sees the context's
features strictly before the anchor and its own block (non-causal), labels
``x_{a+1..a+B-1}``, and a cross-entropy through the frozen output head with
weights decaying by slot. A batch is a pure function of (seed, step), so a
resumed run draws exactly the batches the uninterrupted one would have."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from .data import Dataset
from .model import Drafter

__all__ = ["Batch", "block_loss", "draw_batch", "slot_weights"]

_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the paper's decay per block size


def slot_weights(block: int) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1 (slot 0, the anchor, has no loss)."""
    gamma = _GAMMA.get(block, block / 2)
    return torch.exp(-(torch.arange(1, block, dtype=torch.float32) - 1) / gamma)


class Batch:
    """Padded sequences with their features, and the blocks drawn on them."""

    def __init__(
        self,
        tokens: torch.Tensor,  # (b, S) int64
        feats: torch.Tensor,  # (b, S, width) float32
        anchors: torch.Tensor,  # (b, A) int64
        valid: torch.Tensor,  # (b, A) bool: False for padding anchors (short replies)
        n_tokens: int,
    ):
        self.tokens, self.feats, self.anchors, self.valid, self.n_tokens = tokens, feats, anchors, valid, n_tokens


def draw_batch(
    ds: Dataset,
    items: list[tuple[int, int]],
    seed: int,
    step: int,
    *,
    n_seqs: int,
    n_anchors: int,
    block: int,
    device: str = "cpu",
) -> Batch:
    """Step ``step``'s batch: ``n_seqs`` sequences and ``n_anchors`` anchors in each one's reply."""
    rng = np.random.default_rng([seed, step])
    pick = rng.choice(len(items), size=min(n_seqs, len(items)), replace=False)
    seqs = [ds.sequence(*items[int(i)]) for i in pick]
    s_max = max(len(t) for t, _, _ in seqs)
    width = seqs[0][2].shape[1]
    tokens = np.zeros((len(seqs), s_max), np.int64)
    feats = np.zeros((len(seqs), s_max, width), np.float32)
    anchors = np.zeros((len(seqs), n_anchors), np.int64)
    valid = np.zeros((len(seqs), n_anchors), bool)
    for r, (t, p, f) in enumerate(seqs):
        tokens[r, : len(t)] = t
        feats[r, : len(t)] = f
        # the anchor is the last token kept (at most the prompt's last); its block must fit
        cand = np.arange(max(p - 1, 0), len(t) - block + 1)
        if len(cand) == 0:
            continue
        k = min(n_anchors, len(cand))
        anchors[r, :k] = np.sort(rng.choice(cand, size=k, replace=False))
        valid[r, :k] = True
    return Batch(
        torch.from_numpy(tokens).to(device),
        torch.from_numpy(feats).to(device),
        torch.from_numpy(anchors).to(device),
        torch.from_numpy(valid).to(device),
        int(sum(len(t) for t, _, _ in seqs)),
    )


def _blocks(b: Batch, block: int, mask_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The blocks' input tokens, positions, labels and attention mask (b, 1, N, S+N)."""
    n_seq, s = b.tokens.shape
    n_anchor = b.anchors.shape[1]
    dev = b.tokens.device
    pos = (b.anchors.unsqueeze(-1) + torch.arange(block, device=dev)).reshape(n_seq, -1)  # (b, A*B)
    labels = torch.gather(b.tokens, 1, pos.clamp(max=s - 1))
    slot = torch.arange(n_anchor * block, device=dev) % block
    inputs = torch.where(slot == 0, labels, torch.full_like(labels, mask_id))
    anchor_of_row = b.anchors.repeat_interleave(block, 1)  # (b, N)
    valid_row = b.valid.repeat_interleave(block, 1)
    # context: strictly before the anchor (the features of positions the target has kept)
    ctx_ok = torch.arange(s, device=dev).view(1, 1, s) < anchor_of_row.unsqueeze(-1)
    ctx_ok = ctx_ok & valid_row.unsqueeze(-1)  # a padding block sees only itself (no NaN rows)
    blk = torch.arange(n_anchor * block, device=dev) // block
    self_ok = (blk.view(-1, 1) == blk.view(1, -1)).expand(n_seq, -1, -1)
    mask = torch.cat([ctx_ok, self_ok], -1).unsqueeze(1)
    return inputs, pos, labels, mask


def block_loss(
    model: Drafter, b: Batch, weights: torch.Tensor, mask_id: int
) -> tuple[torch.Tensor, npt.NDArray[np.float64]]:
    """(the slot-weighted cross-entropy with the target's greedy tokens, the accepted length of each
    valid block under greedy verification)."""
    block = model.s.block_size
    inputs, pos, labels, mask = _blocks(b, block, mask_id)
    h = model(b.feats, inputs, pos, mask)
    n_seq, n = inputs.shape
    keep = (torch.arange(n, device=inputs.device) % block > 0).expand(n_seq, -1)
    valid = b.valid.repeat_interleave(block, 1) & keep
    logits = model.logits(h[valid])
    lab = model.to_draft[labels[valid]]  # rows of the (reduced) head; -100 where the drafter cannot propose it
    ce = F.cross_entropy(logits, lab, reduction="none", ignore_index=-100)
    per_slot = torch.cat([weights.new_zeros(1), weights]).to(inputs.device)  # slot 0: the anchor
    w = per_slot.repeat(n // block).expand(n_seq, -1)[valid]
    loss = (ce * w).sum() / w.sum().clamp(min=1e-9)
    with torch.no_grad():
        hit = (logits.argmax(-1) == lab).float().view(-1, block - 1)
        accepted = torch.cumprod(hit, -1).sum(-1).double().cpu().numpy()
    return loss, accepted


def cosine_lr(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine to zero at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))
