"""The drafter in torch, computing what llama.cpp's ``dflash`` graph computes
(``src/models/dflash.cpp``): target features -> fc -> hidden_norm, injected as
K (k_norm, NeoX RoPE) and V in every layer; the block ``[anchor, MASK ...]``
embedded with the target's rows (times ``embedding_scale`` when set), pre-norm
layers with q/k RMS norms, non-causal attention, SwiGLU, the final norm and the
target's output head. Embedding and head are the target's, frozen."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from .shape import DrafterShape

__all__ = ["Drafter"]


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return out


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX rotary embedding (llama.cpp's NEOX type, Hugging Face's rotate_half). x (..., T, D), pos (..., T)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = pos.to(torch.float32).unsqueeze(-1) * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Layer(nn.Module):
    """One drafter layer; ``kv`` also projects the injected context (same weights, no q)."""

    def __init__(self, s: DrafterShape):
        super().__init__()
        self.s = s
        q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        self.attn_norm = RMSNorm(s.n_embd, s.rms_eps)
        self.wq = nn.Linear(s.n_embd, q, bias=False)
        self.wk = nn.Linear(s.n_embd, kv, bias=False)
        self.wv = nn.Linear(s.n_embd, kv, bias=False)
        self.wo = nn.Linear(q, s.n_embd, bias=False)
        self.q_norm = RMSNorm(s.head_dim, s.rms_eps)
        self.k_norm = RMSNorm(s.head_dim, s.rms_eps)
        self.ffn_norm = RMSNorm(s.n_embd, s.rms_eps)
        self.gate = nn.Linear(s.n_embd, s.n_ff, bias=False)
        self.up = nn.Linear(s.n_embd, s.n_ff, bias=False)
        self.down = nn.Linear(s.n_ff, s.n_embd, bias=False)

    def heads(self, t: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n*D) -> (B, n, T, D)
        b, n_tok, _ = t.shape
        return t.view(b, n_tok, n, self.s.head_dim).transpose(1, 2)

    def kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = rope(self.k_norm(self.heads(self.wk(h), self.s.n_head_kv)), pos.unsqueeze(1), self.s.rope_theta)
        return k, self.heads(self.wv(h), self.s.n_head_kv)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, ctx_kv: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        s = self.s
        h = self.attn_norm(x)
        q = rope(self.q_norm(self.heads(self.wq(h), s.n_head)), pos.unsqueeze(1), s.rope_theta)
        k, v = self.kv(h, pos)
        k, v = torch.cat([ctx_kv[0], k], 2), torch.cat([ctx_kv[1], v], 2)
        rep = s.n_head // s.n_head_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, n_tok, _ = a.shape
        x = x + self.wo(a.transpose(1, 2).reshape(b, n_tok, s.n_head * s.head_dim))
        h = self.ffn_norm(x)
        out: torch.Tensor = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return out


class Drafter(nn.Module):
    """A DFlash drafter over a frozen target embedding and head (float32 numpy arrays, (n_vocab, n_embd))."""

    def __init__(self, s: DrafterShape, embd: npt.NDArray[np.float32], head: npt.NDArray[np.float32]):
        super().__init__()
        self.s = s
        n_in = len(s.target_layers) * s.n_embd
        self.fc = nn.Linear(n_in, s.n_embd, bias=False)
        self.hidden_norm = RMSNorm(s.n_embd, s.rms_eps)
        self.layers = nn.ModuleList(Layer(s) for _ in range(s.n_layer))
        self.norm = RMSNorm(s.n_embd, s.rms_eps)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        with torch.no_grad():  # small first logits: a target head's rows are long, a random direction scores high
            self.norm.weight.fill_(0.1)
        # frozen buffers, not parameters: the optimizer and the checkpoint's trainable state skip them.
        # A reduced vocabulary scores only the d2t rows of the target's head; to_draft maps a target
        # id to its row (-100, cross-entropy's ignore index, for ids the drafter cannot propose)
        ids = np.asarray(s.d2t, dtype=np.int64) if s.d2t else np.arange(head.shape[0])
        to_draft = np.full(head.shape[0], -100, dtype=np.int64)
        to_draft[ids] = np.arange(len(ids))
        self.embd: torch.Tensor
        self.head: torch.Tensor
        self.to_draft: torch.Tensor
        self.register_buffer("embd", torch.from_numpy(embd), persistent=False)
        self.register_buffer("head", torch.from_numpy(np.ascontiguousarray(head[ids])), persistent=False)
        self.register_buffer("to_draft", torch.from_numpy(to_draft), persistent=False)
        # Each feature dimension is trained divided by its spread over the data (a target's residual
        # stream has dimensions 10^4 times the others; unscaled, their gradients swamp every other
        # one under clipping). fc is linear, so the GGUF gets fc.weight / feat_scale: the same drafter.
        self.feat_scale: torch.Tensor
        self.register_buffer("feat_scale", torch.ones(n_in))

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """feats (B, S, taps*E) at positions 0..S-1; the blocks' tokens and positions (B, N); mask
        (B, 1, N, S+N), True where a block row may attend. Returns the final hidden states (B, N, E)."""
        g = self.hidden_norm(self.fc(feats / self.feat_scale))
        ctx_pos = torch.arange(feats.shape[1], device=feats.device).expand(feats.shape[0], -1)
        x = F.embedding(tokens, self.embd)
        if self.s.embedding_scale:
            x = x * self.s.embedding_scale
        for layer in self.layers:
            assert isinstance(layer, Layer)
            x = layer(x, pos, layer.kv(g, ctx_pos), mask)
        out: torch.Tensor = self.norm(x)
        return out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.head.T

    def gguf_tensors(self) -> dict[str, npt.NDArray[Any]]:
        """The drafter's tensors under llama.cpp's names (numpy (out, in), as GGUFWriter takes them);
        a reduced vocabulary adds its own head (the target's rows) and ``d2t``."""
        t: dict[str, npt.NDArray[Any]] = {name: _np(p) for name, p in self._named_exports()}
        t["fc.weight"] = _np(self.fc.weight / self.feat_scale)
        if self.s.d2t:
            t["output.weight"] = _np(self.head)
            t["d2t"] = np.asarray(self.s.d2t, dtype=np.int64)
        return t

    def load_gguf_tensors(self, arrays: dict[str, npt.NDArray[np.float32]]) -> None:
        """The reverse of ``gguf_tensors`` (a warm start); every tensor must be there, shaped alike."""
        own = dict(self._named_exports())
        missing = sorted(set(own) - set(arrays))
        if missing:
            raise ValueError(f"tensors missing: {missing[:4]}")
        with torch.no_grad():
            for name, p in own.items():
                a = arrays[name].reshape(p.shape) if arrays[name].size == p.numel() else arrays[name]
                if tuple(a.shape) != tuple(p.shape):
                    raise ValueError(f"{name} has shape {tuple(a.shape)}, the drafter {tuple(p.shape)}")
                p.copy_(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))
            self.fc.weight.mul_(self.feat_scale)  # the GGUF's fc reads unscaled features

    def _named_exports(self) -> list[tuple[str, torch.Tensor]]:
        out: list[tuple[str, torch.Tensor]] = [
            ("fc.weight", self.fc.weight),
            ("enc.output_norm.weight", self.hidden_norm.weight),
        ]
        for i, b in enumerate(self.layers):
            assert isinstance(b, Layer)
            out += [(f"blk.{i}.{name}.weight", p) for name, p in _layer_params(b)]
        out.append(("output_norm.weight", self.norm.weight))
        return out


def _layer_params(b: Layer) -> list[tuple[str, torch.Tensor]]:
    return [
        ("attn_norm", b.attn_norm.weight),
        ("attn_q", b.wq.weight),
        ("attn_k", b.wk.weight),
        ("attn_v", b.wv.weight),
        ("attn_output", b.wo.weight),
        ("attn_q_norm", b.q_norm.weight),
        ("attn_k_norm", b.k_norm.weight),
        ("ffn_norm", b.ffn_norm.weight),
        ("ffn_gate", b.gate.weight),
        ("ffn_up", b.up.weight),
        ("ffn_down", b.down.weight),
    ]


def _np(p: torch.Tensor) -> npt.NDArray[np.float32]:
    return p.detach().float().cpu().numpy()
