"""Tiny random-weight GGUF models for tests and experiments.

``write_pair`` writes a ``qwen3`` target and a matching ``dflash`` drafter
(architecture names and tensor layout as llama.cpp expects them) with the
``gguf`` package (``pip install pydflash[test]``). Shapes are controllable,
and ``broken`` variants produce the malformed drafters the load checks must
refuse. ``write_hybrid_target`` writes a Gated-DeltaNet hybrid target
(``qwen35``, the Qwen3.5/3.6 layout, ``qwen35moe`` or ``qwen3next``), and
``write_hybrid_pair`` adds a drafter with multi-section RoPE as Qwen3.5/3.6
drafters have.

Random tiny models have near-tied logits; the output head here gives a small
set of "hot" tokens large weights, so the greedy argmax is decided by a clear
margin (never by float noise) and a random drafter agrees with the target
often enough to exercise partial acceptance.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .archs import NO_QK_NORM, arch_tensors
from .drafters import DrafterVariant, variant_keys, variant_tensors

if TYPE_CHECKING:
    import gguf

__all__ = [
    "FIM_TOKENS", "THINKING_TEMPLATE", "DrafterSpec", "DrafterVariant", "Hparams", "HybridSpec", "TargetSpec",
    "Tokenizer", "add_hparams", "spm_tokenizer", "tokenizer", "vocabulary", "write_dflash_gguf", "write_drafter",
    "write_hybrid_pair", "write_hybrid_target", "write_pair", "write_qwen3_gguf", "write_target",
]  # fmt: skip

EOS = "<|endoftext|>"
MASK = "<|mask|>"
BOS = "<|begin_of_text|>"  # the "bpe-bos" vocabulary's
# Qwen2.5-Coder's fill-in-the-middle tokens (names llama.cpp's vocabulary also finds by text),
# by the suffix of their tokenizer.ggml.fim_<part>_token_id key
FIM_TOKENS = {
    "pre": "<|fim_prefix|>",
    "suf": "<|fim_suffix|>",
    "mid": "<|fim_middle|>",
    "pad": "<|fim_pad|>",
    "rep": "<|fim_repo|>",
    "sep": "<|file_sep|>",
}

_CORPUS = """
def main(argv=None):
    parser = argparse.ArgumentParser(description="the quick brown fox jumps over the lazy dog")
    for index, value in enumerate(values):
        if value is not None and index % 2 == 0:
            result.append(self.transform(value))
    return result
The target model verifies every drafted token in one pass, and the drafter
fills the whole block at once. Speculative decoding keeps the output of the
target exactly when the temperature is zero. import os, sys; print("hello world")
"""


def vocabulary(kind: str, n_vocab: int = 384, specials: Sequence[str] = ()) -> Tokenizer:
    """``TargetSpec.vocab``'s tokenizer: "bpe" (``tokenizer``), "bpe-bos" (that one with a
    BOS the vocabulary asks for) or "spm" (``spm_tokenizer``)."""
    if kind == "bpe":
        return tokenizer(n_vocab, specials)
    if kind == "bpe-bos":
        tok = tokenizer(n_vocab, [*specials, BOS])
        return dataclasses.replace(tok, bos=tok.tokens.index(BOS))
    if kind == "spm":
        if specials:
            raise ValueError("the spm vocabulary has no FIM tokens")
        return spm_tokenizer(n_vocab)
    raise ValueError(f"vocab must be 'bpe', 'bpe-bos' or 'spm', not {kind!r}")


def spm_tokenizer(n_vocab: int = 384) -> Tokenizer:
    """A SentencePiece-style vocabulary as llama.cpp's ``llama`` tokenizer model reads it:
    <unk>, <s> (BOS, added), </s> (EOS), the 256 byte-fallback pieces, "▁" and the letters,
    then the corpus' words as "▁"-prefixed chains ("▁h", "▁he", ... "▁hello", longer ones
    scored higher, so that bigram merges reach the whole word), a MASK token, unused padding."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3] + [6] * 256
    pieces = {p: -1.0 for p in ["▁", *"abcdefghijklmnopqrstuvwxyz"]}
    room = n_vocab - len(tokens) - 1  # and the MASK
    words = sorted(set(re.findall(r"[a-z]+", _CORPUS.lower())), key=lambda w: (len(w), w))
    for word in ["hello", "world", *words]:
        chain = {"▁" + word[:i]: -1.0 / (i + 1) for i in range(1, len(word) + 1)}
        if len(pieces.keys() | chain.keys()) > room:
            break
        pieces.update(chain)
    if len(pieces) > room:
        raise ValueError(f"n_vocab must be >= {len(tokens) + len(pieces) + 1} for the spm vocabulary")
    tokens += list(pieces)
    types += [1] * len(pieces)
    scores = [0.0] * 259 + list(pieces.values())
    mask = len(tokens)
    tokens.append(MASK)
    types.append(3)
    scores.append(0.0)
    while len(tokens) < n_vocab:
        tokens.append(f"<unused_{len(tokens)}>")
        types.append(5)
        scores.append(0.0)
    return Tokenizer(tokens, types, [], eos=2, mask=mask, pre="default", model="llama", bos=1, scores=tuple(scores))


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable unicode map (byte-level BPE)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """A vocabulary as llama.cpp reads it: a byte-level BPE (its ``gpt2`` tokenizer model),
    or a SentencePiece-style one (``llama``: pieces with scores, a "▁" space prefix)."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    eos: int
    mask: int
    pre: str = "qwen2"  # llama.cpp pre-tokenizer name
    model: str = "gpt2"  # llama.cpp's tokenizer.ggml.model
    bos: int = -1  # >= 0: the BOS token, which the vocabulary asks to add (add_bos_token)
    scores: tuple[float, ...] = ()  # a SentencePiece vocabulary's piece scores


def tokenizer(n_vocab: int = 384, specials: Sequence[str] = ()) -> Tokenizer:
    """A deterministic byte-level BPE of exactly ``n_vocab`` tokens: 256 bytes,
    merges learned on a small built-in text, EOS and MASK control tokens, the
    ``specials`` (control tokens, in place of the last merges), then unused control
    tokens as padding."""
    if n_vocab < 260 + len(specials):
        raise ValueError("n_vocab must be >= 260 (256 bytes + merges + 2 specials) + len(specials)")
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    n_merges = min(n_vocab - 258 - len(specials), 200)
    words = [[b2u[b] for b in w.encode()] for w in re.findall(r" ?\w+| ?[^\w\s]+|\s+", _CORPUS)]
    merges: list[str] = []
    vocab = set(tokens)
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w in words:
            pairs.update(itertools.pairwise(w))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        if a + b not in vocab:
            vocab.add(a + b)
            tokens.append(a + b)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i : i + 2] = [a + b]
                i += 1
    types = [1] * len(tokens)
    eos = len(tokens)
    tokens += [EOS, MASK, *specials]
    types += [3] * (2 + len(specials))
    while len(tokens) < n_vocab:
        tokens.append(f"<|unused_{len(tokens)}|>")
        types.append(5)
    return Tokenizer(tokens[:n_vocab], types[:n_vocab], merges, eos, eos + 1)


@dataclasses.dataclass(frozen=True)
class TargetSpec:
    """The shape of a tiny random ``qwen3`` target written by ``write_target`` / ``write_pair``."""

    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 384
    n_ctx: int = 4096
    hot_tokens: int = 12
    head_scale: float = 8.0
    seed: int = 0
    eos_hot: bool = False  # give end-of-text a hot head row, so generations can end
    chat_template: str | None = None  # written as tokenizer.chat_template (jinja)
    # FIM_TOKENS' parts ("pre", "suf", "mid", "pad", "rep", "sep") in the vocabulary, each named
    # in its tokenizer.ggml.fim_<part>_token_id
    fim: tuple[str, ...] = ()
    # > 0: every token embedding shares one direction, this many times the random part's length, so the
    # next token depends little on the context and drafters propose nearly p (long accepted blocks)
    embd_common: float = 0.0
    # > 0: hot head rows come in pairs, the second the first plus this much relative noise (near ties)
    tie_eps: float = 0.0
    # the vocabulary: "bpe" (byte-level, no BOS), "bpe-bos" (the same with a BOS it asks for) or
    # "spm" (SentencePiece-style: "▁" pieces with scores, byte fallback, BOS added)
    vocab: str = "bpe"


@dataclasses.dataclass(frozen=True)
class HybridSpec(TargetSpec):
    """A Gated-DeltaNet hybrid target: every ``full_attention_interval``-th
    layer is full attention, the others recurrent (as in Qwen3.5/3.6)."""

    architecture: str = "qwen35"  # or "qwen35moe" (MoE FFNs), "qwen3next" (MoE, no partial rollback)
    full_attention_interval: int = 4
    rope_sections: tuple[int, int, int, int] = (3, 3, 2, 0)  # qwen35*: rope pairs per section (sum <= head_dim / 2)
    ssm_d_state: int = 16  # head size of the recurrent layers (keys and values)
    ssm_n_group: int = 2  # key heads
    ssm_dt_rank: int = 4  # value heads
    ssm_d_conv: int = 4
    ssm_out_scale: float = 3.0  # how strongly the recurrent layers move the residual stream
    ssm_decay: float = 0.05  # -A: small means a long memory
    n_expert: int = 4  # MoE architectures only
    n_expert_used: int = 2


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
    """The shape of a tiny random DFlash drafter written by ``write_drafter`` / ``write_pair``."""

    n_layer: int = 1
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    target_layers: tuple[int, ...] = (1, 3)
    block_size: int = 8
    seed: int = 1
    attn_out_scale: float = 4.0
    # 0: the final norm's weights are zero, so every logit the drafter gives is exactly 0 and
    # its q is the sampling chain applied to a flat row (known without running the drafter)
    output_norm_scale: float = 1.0
    # broken variants, for tests of the load checks
    architecture: str = "dflash"
    n_embd: int | None = None  # None = the target's
    n_vocab: int | None = None  # None = the target's
    mask_token: bool = True
    extra_tensors: tuple[str, ...] = ()
    rope_sections: tuple[int, int, int, int] | None = None  # multi-section RoPE (Qwen3.5/3.6 drafters)
    variant: DrafterVariant = dataclasses.field(default_factory=DrafterVariant)  # DFlash2, DSpark, d2t


@dataclasses.dataclass(frozen=True)
class Hparams:
    """Shape hyper-parameters shared by the qwen3 and dflash GGUF layouts."""

    n_ctx: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


def write_qwen3_gguf(
    path: str | Path,
    hp: Hparams,
    tok: Tokenizer,
    tensors: dict[str, np.ndarray],
    *,
    name: str,
    architecture: str = "qwen3",
    extra_kv: Mapping[str, str | int] | None = None,
) -> Path:
    """Write a target GGUF. ``tensors`` uses llama.cpp names (token_embd.weight,
    blk.N.attn_q.weight, ..., output.weight) with numpy shapes (rows, cols) =
    (out_features, in_features), as torch stores nn.Linear weights."""
    return write_gguf(path, architecture, name, hp, tok, tensors, mask_token=False, extra_kv=extra_kv)


def write_dflash_gguf(
    path: str | Path,
    hp: Hparams,
    tok: Tokenizer,
    tensors: dict[str, np.ndarray],
    *,
    block_size: int | None,
    target_layers: Sequence[int],
    name: str,
    mask_token: bool = True,
    architecture: str = "dflash",
    extra_kv: dict[str, str] | None = None,
    rope_sections: Sequence[int] | None = None,
    more_keys: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Write a DFlash drafter GGUF (embeddings and head are the target's).
    ``target_layers`` are llama.cpp ids: the INPUT of those target layers.
    ``rope_sections`` (4 ints) makes it a multi-section-RoPE drafter, as
    drafters of Qwen3.5/3.6 targets are; ``block_size`` None leaves the key out;
    ``more_keys`` writes more (the DFlash2/DSpark keys)."""

    def dflash_keys(w: gguf.GGUFWriter) -> None:
        if block_size is not None:
            w.add_uint32(f"{architecture}.block_size", block_size)
        if more_keys is not None:
            more_keys(w)
        w.add_bool(f"{architecture}.attention.causal", False)
        w.add_array(f"{architecture}.target_layers", [int(x) for x in target_layers])
        if rope_sections is not None:
            w.add_array(f"{architecture}.rope.dimension_sections", [int(x) for x in rope_sections])

    return write_gguf(
        path, architecture, name, hp, tok, tensors, mask_token=mask_token, extra_kv=extra_kv, arch_keys=dflash_keys
    )


def write_gguf(
    path: str | Path,
    architecture: str,
    name: str,
    hp: Hparams,
    tok: Tokenizer,
    tensors: dict[str, np.ndarray],
    *,
    mask_token: bool,
    extra_kv: Mapping[str, str | int] | None,
    arch_keys: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """Write a GGUF: its hyper-parameters, ``arch_keys``' keys, the tokenizer and ``tensors``."""
    import gguf

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_name(name)
    add_hparams(w, architecture, hp)
    if arch_keys is not None:
        arch_keys(w)
    _add_tokenizer(w, tok, mask=mask_token)
    for k, v in (extra_kv or {}).items():
        if isinstance(v, int):
            w.add_uint32(k, v)  # a token id
        else:
            w.add_string(k, v)
    for tname, arr in tensors.items():
        w.add_tensor(tname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def add_hparams(w: gguf.GGUFWriter, arch: str, hp: Hparams) -> None:
    """The shape keys both the qwen3 and the dflash layouts carry."""
    w.add_uint32(f"{arch}.context_length", hp.n_ctx)
    w.add_uint32(f"{arch}.embedding_length", hp.n_embd)
    w.add_uint32(f"{arch}.block_count", hp.n_layer)
    w.add_uint32(f"{arch}.feed_forward_length", hp.n_ff)
    w.add_uint32(f"{arch}.attention.head_count", hp.n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", hp.n_head_kv)
    w.add_uint32(f"{arch}.attention.key_length", hp.head_dim)
    w.add_uint32(f"{arch}.attention.value_length", hp.head_dim)
    w.add_float32(f"{arch}.rope.freq_base", hp.rope_theta)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", hp.rms_eps)


def _add_tokenizer(w: gguf.GGUFWriter, tok: Tokenizer, *, mask: bool) -> None:
    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    if tok.merges:
        w.add_token_merges(tok.merges)
    if tok.scores:
        w.add_token_scores(list(tok.scores))
    w.add_eos_token_id(tok.eos)
    w.add_add_bos_token(tok.bos >= 0)
    if tok.bos >= 0:
        w.add_bos_token_id(tok.bos)
    if mask:
        w.add_mask_token_id(tok.mask)


# A small Qwen3-style jinja chat template with reasoning blocks and a thinking
# switch, for tests (llama.cpp's template analysis finds its <think> tags).
THINKING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.role == 'assistant' and message.reasoning_content -%}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{{- message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


def _rng_tensor(rng: np.random.Generator, shape: Sequence[int], scale: float) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _norm(rng: np.random.Generator, n: int) -> np.ndarray:
    return (1.0 + 0.05 * rng.standard_normal(n)).astype(np.float32)


def _attention_layer(
    rng: np.random.Generator,
    i: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int,
    n_ff: int,
    out_scale: float = 1.0,
    qk_norm: bool = True,
) -> dict[str, np.ndarray]:
    s = 1.0 / np.sqrt(n_embd)
    t = {
        f"blk.{i}.attn_norm.weight": _norm(rng, n_embd),
        f"blk.{i}.attn_q.weight": _rng_tensor(rng, (n_head * head_dim, n_embd), s),
        f"blk.{i}.attn_k.weight": _rng_tensor(rng, (n_head_kv * head_dim, n_embd), s),
        f"blk.{i}.attn_v.weight": _rng_tensor(rng, (n_head_kv * head_dim, n_embd), s),
        f"blk.{i}.attn_output.weight": _rng_tensor(
            rng, (n_embd, n_head * head_dim), out_scale / np.sqrt(n_head * head_dim)
        ),
    }
    if qk_norm:
        t[f"blk.{i}.attn_q_norm.weight"] = _norm(rng, head_dim)
        t[f"blk.{i}.attn_k_norm.weight"] = _norm(rng, head_dim)
    t[f"blk.{i}.ffn_norm.weight"] = _norm(rng, n_embd)
    t[f"blk.{i}.ffn_gate.weight"] = _rng_tensor(rng, (n_ff, n_embd), s)
    t[f"blk.{i}.ffn_up.weight"] = _rng_tensor(rng, (n_ff, n_embd), s)
    t[f"blk.{i}.ffn_down.weight"] = _rng_tensor(rng, (n_embd, n_ff), 1.0 / np.sqrt(n_ff))
    return t


def _token_embd(rng: np.random.Generator, s: TargetSpec) -> np.ndarray:
    e = _rng_tensor(rng, (s.n_vocab, s.n_embd), 1.0)
    if s.embd_common:
        c = np.random.default_rng(s.seed + 7919).standard_normal(s.n_embd)  # own stream: other tensors unchanged
        e += (s.embd_common * c).astype(np.float32)
    return e


def _head(rng: np.random.Generator, s: TargetSpec, tok: Tokenizer) -> np.ndarray:
    # hot rows get large weights (clear argmax margins), the rest small
    head = _rng_tensor(rng, (s.n_vocab, s.n_embd), 0.01)
    normal = [i for i, t in enumerate(tok.types) if t == 1]
    hot = rng.choice(normal, size=min(s.hot_tokens, len(normal)), replace=False)
    if s.eos_hot:
        hot = np.append(hot, tok.eos)
    head[hot] = _rng_tensor(rng, (len(hot), s.n_embd), s.head_scale)
    if s.tie_eps:
        noise = np.random.default_rng(s.seed + 104729).standard_normal((len(hot) // 2, s.n_embd))
        head[hot[1::2][: len(noise)]] = head[hot[0::2][: len(noise)]] + (s.tie_eps * s.head_scale * noise)
    return head


def write_target(
    path: str | Path,
    spec: TargetSpec = TargetSpec(),
    *,
    architecture: str = "qwen3",
    extra_kv: Mapping[str, str | int] | None = None,
) -> Path:
    """Write a tiny random ``qwen3`` target GGUF (or another llama-style ``architecture``: qwen2, llama,
    smollm3, phi3, gemma3, xverse); ``extra_kv``: more metadata (``tokenizer.ggml.eot_token_id``, ...)."""
    s = spec
    rng = np.random.default_rng(s.seed)
    tok = vocabulary(s.vocab, s.n_vocab, [FIM_TOKENS[part] for part in s.fim])
    hp = Hparams(s.n_ctx, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)
    tensors = {"token_embd.weight": _token_embd(rng, s)}
    for i in range(s.n_layer):
        # qwen2 and other llama-style graphs have no per-head q/k norms
        tensors.update(
            _attention_layer(
                rng,
                i,
                s.n_embd,
                s.n_head,
                s.n_head_kv,
                s.head_dim,
                s.n_ff,
                qk_norm=architecture not in NO_QK_NORM,
            )
        )
    tensors = arch_tensors(architecture, tensors, s.n_layer, np.random.default_rng(s.seed + 4099))
    tensors["output_norm.weight"] = _norm(rng, s.n_embd)
    tensors["output.weight"] = _head(rng, s, tok)
    extra: dict[str, str | int] = {"tokenizer.chat_template": s.chat_template} if s.chat_template is not None else {}
    if s.fim:
        extra.update({f"tokenizer.ggml.fim_{part}_token_id": tok.tokens.index(FIM_TOKENS[part]) for part in s.fim})
    extra.update(extra_kv or {})
    return write_qwen3_gguf(
        path,
        hp,
        tok,
        tensors,
        # not "phi3" in the name: llama.cpp would then look for Phi-3's own special tokens
        name=f"pydflash tiny {architecture.replace('phi3', 'phi-three')} target",
        architecture=architecture,
        extra_kv=extra,
    )


def _ffn(
    rng: np.random.Generator, i: int, n_embd: int, n_ff: int, prefix: str = "ffn", suffix: str = ""
) -> dict[str, np.ndarray]:
    s = 1.0 / np.sqrt(n_embd)
    return {
        f"blk.{i}.{prefix}_gate{suffix}.weight": _rng_tensor(rng, (n_ff, n_embd), s),
        f"blk.{i}.{prefix}_up{suffix}.weight": _rng_tensor(rng, (n_ff, n_embd), s),
        f"blk.{i}.{prefix}_down{suffix}.weight": _rng_tensor(rng, (n_embd, n_ff), 1.0 / np.sqrt(n_ff)),
    }


_MOE = ("qwen35moe", "qwen3next")


def _hybrid_layer(rng: np.random.Generator, i: int, s: HybridSpec) -> dict[str, np.ndarray]:
    # numpy shapes are (out, in): the reverse of llama.cpp's {ne0, ne1}
    e = s.n_embd
    sc = 1.0 / np.sqrt(e)
    t = {f"blk.{i}.attn_norm.weight": _norm(rng, e), f"blk.{i}.post_attention_norm.weight": _norm(rng, e)}
    if (i + 1) % s.full_attention_interval == 0:
        # gated full attention: attn_q holds query and gate, per head
        t.update(
            {
                f"blk.{i}.attn_q.weight": _rng_tensor(rng, (2 * s.n_head * s.head_dim, e), sc),
                f"blk.{i}.attn_k.weight": _rng_tensor(rng, (s.n_head_kv * s.head_dim, e), sc),
                f"blk.{i}.attn_v.weight": _rng_tensor(rng, (s.n_head_kv * s.head_dim, e), sc),
                f"blk.{i}.attn_output.weight": _rng_tensor(
                    rng, (e, s.n_head * s.head_dim), 1.0 / np.sqrt(s.n_head * s.head_dim)
                ),
                f"blk.{i}.attn_q_norm.weight": _norm(rng, s.head_dim),
                f"blk.{i}.attn_k_norm.weight": _norm(rng, s.head_dim),
            }
        )
    else:
        key_dim = s.ssm_d_state * s.ssm_n_group
        value_dim = s.ssm_d_state * s.ssm_dt_rank
        conv_dim = 2 * key_dim + value_dim
        t.update(
            {
                f"blk.{i}.attn_qkv.weight": _rng_tensor(rng, (conv_dim, e), sc),
                f"blk.{i}.attn_gate.weight": _rng_tensor(rng, (value_dim, e), sc),
                f"blk.{i}.ssm_conv1d.weight": _rng_tensor(rng, (conv_dim, s.ssm_d_conv), 1.0 / np.sqrt(s.ssm_d_conv)),
                f"blk.{i}.ssm_dt.bias": _rng_tensor(rng, (s.ssm_dt_rank,), 0.5),
                # A < 0 (decay); small |A| keeps a long memory, so the state matters
                f"blk.{i}.ssm_a": (-s.ssm_decay * (0.5 + rng.random(s.ssm_dt_rank))).astype(np.float32),
                f"blk.{i}.ssm_norm.weight": _norm(rng, s.ssm_d_state),
                f"blk.{i}.ssm_out.weight": _rng_tensor(rng, (e, value_dim), s.ssm_out_scale / np.sqrt(value_dim)),
            }
        )
        if s.architecture == "qwen3next":
            t[f"blk.{i}.ssm_ba.weight"] = _rng_tensor(rng, (2 * s.ssm_dt_rank, e), sc)
        else:
            t[f"blk.{i}.ssm_beta.weight"] = _rng_tensor(rng, (s.ssm_dt_rank, e), sc)
            t[f"blk.{i}.ssm_alpha.weight"] = _rng_tensor(rng, (s.ssm_dt_rank, e), sc)
    if s.architecture in _MOE:
        n_ff_exp = s.n_ff // s.n_expert_used
        t[f"blk.{i}.ffn_gate_inp.weight"] = _rng_tensor(rng, (s.n_expert, e), sc)
        t[f"blk.{i}.ffn_gate_exps.weight"] = _rng_tensor(rng, (s.n_expert, n_ff_exp, e), sc)
        t[f"blk.{i}.ffn_up_exps.weight"] = _rng_tensor(rng, (s.n_expert, n_ff_exp, e), sc)
        t[f"blk.{i}.ffn_down_exps.weight"] = _rng_tensor(rng, (s.n_expert, e, n_ff_exp), 1.0 / np.sqrt(n_ff_exp))
        t[f"blk.{i}.ffn_gate_inp_shexp.weight"] = _rng_tensor(rng, (e,), sc)
        t.update(_ffn(rng, i, e, s.n_ff, suffix="_shexp"))
    else:
        t.update(_ffn(rng, i, e, s.n_ff))
    return t


def hybrid_keys(w: gguf.GGUFWriter, s: HybridSpec) -> None:
    """The hybrid architecture's metadata keys (recurrent layers, RoPE sections, experts)."""
    a = s.architecture
    w.add_uint32(f"{a}.full_attention_interval", s.full_attention_interval)
    w.add_uint32(f"{a}.ssm.conv_kernel", s.ssm_d_conv)
    w.add_uint32(f"{a}.ssm.state_size", s.ssm_d_state)
    w.add_uint32(f"{a}.ssm.group_count", s.ssm_n_group)
    w.add_uint32(f"{a}.ssm.time_step_rank", s.ssm_dt_rank)
    w.add_uint32(f"{a}.ssm.inner_size", s.ssm_d_state * s.ssm_dt_rank)
    if a != "qwen3next":
        w.add_array(f"{a}.rope.dimension_sections", [int(x) for x in s.rope_sections])
    if a in _MOE:
        w.add_uint32(f"{a}.expert_count", s.n_expert)
        w.add_uint32(f"{a}.expert_used_count", s.n_expert_used)
        w.add_uint32(f"{a}.expert_feed_forward_length", s.n_ff // s.n_expert_used)
        w.add_uint32(f"{a}.expert_shared_feed_forward_length", s.n_ff)


def write_hybrid_target(path: str | Path, spec: HybridSpec = HybridSpec()) -> Path:
    """Write a tiny random Gated-DeltaNet hybrid target: ``qwen35`` (the
    Qwen3.5/3.6 layout: IMRoPE, partial rollback in llama.cpp), ``qwen35moe``
    (the same with MoE FFNs) or ``qwen3next`` (MoE FFNs; llama.cpp has no
    partial rollback for it)."""
    s = spec
    tensors, tok = hybrid_tensors(s)
    hp = Hparams(s.n_ctx, s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)
    name = f"pydflash tiny {s.architecture} target"
    keys = functools.partial(hybrid_keys, s=s)
    return write_gguf(path, s.architecture, name, hp, tok, tensors, mask_token=False, extra_kv=None, arch_keys=keys)


def hybrid_tensors(s: HybridSpec) -> tuple[dict[str, np.ndarray], Tokenizer]:
    """The hybrid target's tensors (random from ``s.seed``) and its tokenizer."""
    if s.architecture not in ("qwen35", "qwen35moe", "qwen3next"):
        raise ValueError(f"architecture must be 'qwen35', 'qwen35moe' or 'qwen3next', got {s.architecture!r}")
    if s.architecture != "qwen3next" and sum(s.rope_sections) * 2 > s.head_dim:
        raise ValueError("rope_sections count rope pairs: their sum must be <= head_dim / 2")
    rng = np.random.default_rng(s.seed)
    tok = tokenizer(s.n_vocab)
    tensors = {"token_embd.weight": _token_embd(rng, s)}
    for i in range(s.n_layer):
        tensors.update(_hybrid_layer(rng, i, s))
    tensors["output_norm.weight"] = _norm(rng, s.n_embd)
    tensors["output.weight"] = _head(rng, s, tok)
    return tensors, tok


def write_drafter(
    path: str | Path, target: TargetSpec = TargetSpec(), spec: DrafterSpec = DrafterSpec(), t: Path | None = None
) -> Path:
    """Write a tiny random ``dflash`` drafter for ``target`` (or a broken one); ``spec.variant``
    makes it DFlash2, DSpark or reduced-vocabulary (its d2t head copies target file ``t``'s)."""
    s = spec
    n_embd = s.n_embd or target.n_embd
    rng = np.random.default_rng(s.seed)
    hp = Hparams(target.n_ctx, n_embd, s.n_layer, s.n_head, s.n_head_kv, s.head_dim, s.n_ff)
    n_in = len(s.target_layers) * n_embd
    tensors = {
        "fc.weight": _rng_tensor(rng, (n_embd, n_in), 1.0 / np.sqrt(n_in)),
        "enc.output_norm.weight": _norm(rng, n_embd),
    }
    for i in range(s.n_layer):
        # a strong attention output makes the block depend on the injected context
        tensors.update(
            _attention_layer(rng, i, n_embd, s.n_head, s.n_head_kv, s.head_dim, s.n_ff, out_scale=s.attn_out_scale)
        )
    tensors["output_norm.weight"] = _norm(rng, n_embd) * np.float32(s.output_norm_scale)
    for name in s.extra_tensors:
        tensors[name] = _rng_tensor(rng, (4, n_embd), 0.1)
    v = s.variant
    tensors.update(variant_tensors(v, n_embd, s.n_vocab or target.n_vocab, s.n_layer, s.seed, t))
    return write_dflash_gguf(
        path,
        hp,
        # the target's vocabulary (its FIM tokens too), unless the drafter has its own size
        tokenizer(s.n_vocab or target.n_vocab, [] if s.n_vocab else [FIM_TOKENS[part] for part in target.fim]),
        tensors,
        block_size=None if "block_size" in v.omit_keys else s.block_size,
        target_layers=s.target_layers,
        name=f"pydflash tiny {v.kind} drafter",
        mask_token=s.mask_token,
        architecture=s.architecture,
        rope_sections=s.rope_sections,
        more_keys=variant_keys(v, s.architecture, s.n_layer),
    )


def write_pair(
    directory: str | Path,
    target: TargetSpec = TargetSpec(),
    drafter: DrafterSpec = DrafterSpec(),
    *,
    prefix: str = "tiny",
) -> tuple[Path, Path]:
    """Write a matching target + drafter into ``directory``; returns both paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    t = write_target(directory / f"{prefix}-target.gguf", target)
    d = write_drafter(directory / f"{prefix}-drafter.gguf", target, drafter, t)
    return t, d


def write_hybrid_pair(
    directory: str | Path,
    target: HybridSpec = HybridSpec(),
    drafter: DrafterSpec | None = None,
    *,
    prefix: str = "hybrid",
) -> tuple[Path, Path]:
    """Write a hybrid target and a matching drafter (by default one with the
    target's multi-section RoPE layout, as Qwen3.5/3.6 drafters carry)."""
    if drafter is None:
        sections = None if target.architecture == "qwen3next" else target.rope_sections
        drafter = DrafterSpec(target_layers=(1, target.n_layer - 1), rope_sections=sections)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    t = write_hybrid_target(directory / f"{prefix}-target.gguf", target)
    d = write_drafter(directory / f"{prefix}-drafter.gguf", target, drafter, t)
    return t, d
