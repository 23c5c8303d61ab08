"""Byte-level BPE trained with the `tokenizers` library and exported in the
form llama.cpp's `gpt2` tokenizer with the `gpt-2` pre-tokenizer reads, so
that llama.cpp reproduces it exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

EOS = "<|endoftext|>"
MASK = "<|mask|>"


def train(texts: Iterable[str], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # GPT-2's regex split + byte-level alphabet: llama.cpp's "gpt-2" pre-tokenizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(out))
    return tok


def load(path: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def to_gguf_tokenizer(path: Path):
    """The trained tokenizer as pydflash.gguf_writers.Tokenizer (GGUF fields)."""
    from pydflash.gguf_writers import Tokenizer as GgufTokenizer

    data = json.loads(Path(path).read_text())
    vocab: dict[str, int] = data["model"]["vocab"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    specials = {a["content"]: a["id"] for a in data["added_tokens"]}
    types = [3 if t in specials else 1 for t in tokens]
    return GgufTokenizer(tokens=tokens, types=types, merges=merges, eos=specials[EOS], mask=specials[MASK],
                         pre="gpt-2")
