"""The target as a torch module computing exactly what llama.cpp's `qwen3`
graph computes (NeoX RoPE, q/k RMS norms, SwiGLU, pre-norm residuals), plus its
export to llama.cpp tensor names. The drafter is pydflash.train's."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from pydflash.train.model import RMSNorm, rope  # the drafter's: the same norm and RoPE as llama.cpp's


@dataclasses.dataclass(frozen=True)
class Config:
    n_vocab: int = 4096
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 768
    n_ctx: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_head_kv * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, c.n_embd, bias=False)

    def heads(self, t: torch.Tensor, n: int) -> torch.Tensor:  # (B,T,n*D) -> (B,n,T,D)
        b, s, _ = t.shape
        return t.view(b, s, n, self.c.head_dim).transpose(1, 2)

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.c
        k = rope(self.k_norm(self.heads(self.wk(h), c.n_head_kv)), pos.unsqueeze(1), c.rope_theta)
        v = self.heads(self.wv(h), c.n_head_kv)
        return k, v

    def forward(self, x: torch.Tensor, pos: torch.Tensor, *, ctx_kv=None, mask=None, causal=False) -> torch.Tensor:
        c = self.c
        h = self.attn_norm(x)
        q = rope(self.q_norm(self.heads(self.wq(h), c.n_head)), pos.unsqueeze(1), c.rope_theta)
        k, v = self.kv(h, pos)
        if ctx_kv is not None:  # DFlash: injected context K/V in front of the block's own
            k = torch.cat([ctx_kv[0], k], 2)
            v = torch.cat([ctx_kv[1], v], 2)
        rep = c.n_head // c.n_head_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
        b, _, s, _ = a.shape
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, c.n_head * c.head_dim))
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Target(nn.Module):
    """Qwen3 decoder, untied head."""

    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.n_vocab, c.n_embd)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.rms_eps)
        self.head = nn.Linear(c.n_embd, c.n_vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        for blk in self.layers:  # scaled residual projections
            nn.init.normal_(blk.wo.weight, std=0.02 / math.sqrt(2 * c.n_layer))
            nn.init.normal_(blk.down.weight, std=0.02 / math.sqrt(2 * c.n_layer))

    def forward(self, tokens: torch.Tensor, taps: tuple[int, ...] = ()):
        """Logits, and the INPUTS of the layers in `taps` (llama.cpp's layer ids)."""
        pos = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        x = self.embed(tokens)
        feats = []
        for i, blk in enumerate(self.layers):
            if i in taps:
                feats.append(x)
            x = blk(x, pos, causal=True)
        logits = self.head(self.norm(x))
        return logits, (torch.cat(feats, -1) if taps else None)

    def gguf_tensors(self, dtype=np.float16) -> dict[str, np.ndarray]:
        t = {"token_embd.weight": _np(self.embed.weight, dtype)}
        for i, blk in enumerate(self.layers):
            t.update(_block_tensors(i, blk, dtype))
        t["output_norm.weight"] = _np(self.norm.weight, np.float32)
        t["output.weight"] = _np(self.head.weight, dtype)
        return t


def _np(p: torch.Tensor, dtype) -> np.ndarray:
    return p.detach().cpu().numpy().astype(dtype)


def _block_tensors(i: int, b: Block, dtype) -> dict[str, np.ndarray]:
    f32 = np.float32
    return {
        f"blk.{i}.attn_norm.weight": _np(b.attn_norm.weight, f32),
        f"blk.{i}.attn_q.weight": _np(b.wq.weight, dtype),
        f"blk.{i}.attn_k.weight": _np(b.wk.weight, dtype),
        f"blk.{i}.attn_v.weight": _np(b.wv.weight, dtype),
        f"blk.{i}.attn_output.weight": _np(b.wo.weight, dtype),
        f"blk.{i}.attn_q_norm.weight": _np(b.q_norm.weight, f32),
        f"blk.{i}.attn_k_norm.weight": _np(b.k_norm.weight, f32),
        f"blk.{i}.ffn_norm.weight": _np(b.ffn_norm.weight, f32),
        f"blk.{i}.ffn_gate.weight": _np(b.gate.weight, dtype),
        f"blk.{i}.ffn_up.weight": _np(b.up.weight, dtype),
        f"blk.{i}.ffn_down.weight": _np(b.down.weight, dtype),
    }
