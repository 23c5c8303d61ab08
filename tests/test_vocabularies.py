"""``tokenize(add_bos=)`` and ``detokenize(prev_tokens=)`` on vocabularies where they
matter (the default test vocabulary asks for no BOS and has no space prefix, so a
tokenizer that ignored either argument passed every other test): a byte-level BPE that
asks for a BOS, and a SentencePiece-style one, whose first word loses its "▁" space at
the start of a text but not after other tokens."""

from __future__ import annotations

import dataclasses

import pytest

from pydflash import Llama, gguf_writers
from support.models import TARGET


@pytest.fixture(scope="module")
def vocab_models(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("vocabs")
    specs = {v: dataclasses.replace(TARGET, vocab=v) for v in ("bpe-bos", "spm")}
    return {v: gguf_writers.write_target(d / f"{v}.gguf", spec) for v, spec in specs.items()}


@pytest.mark.parametrize("vocab", ["bpe-bos", "spm"])
def test_add_bos_adds_the_bos_the_vocabulary_asks_for(vocab_models, vocab):
    with Llama(vocab_models[vocab], n_ctx=64) as llm:
        bos = llm.token_bos()
        assert bos >= 0
        bare = llm.tokenize(b"hello world", add_bos=False)
        assert bos not in bare
        assert llm.tokenize(b"hello world", add_bos=True) == [bos, *bare]
        assert llm.tokenize(b"hello world") == [bos, *bare]  # llama-cpp-python's default


def test_detokenize_leaves_out_the_text_of_prev_tokens(vocab_models):
    with Llama(vocab_models["spm"], n_ctx=64) as llm:
        ids = llm.tokenize(b"hello world", add_bos=False)
        cut = len(llm.tokenize(b"hello", add_bos=False))
        assert llm.detokenize(ids) == b"hello world"
        assert llm.detokenize(ids[cut:]) == b"world"  # alone, a text's first word has no space
        assert llm.detokenize(ids[cut:], prev_tokens=ids[:cut]) == b" world"
        assert llm.detokenize(ids[:cut]) + llm.detokenize(ids[cut:], prev_tokens=ids[:cut]) == b"hello world"


def test_generation_runs_on_both(vocab_models):
    for path in vocab_models.values():
        with Llama(path, n_ctx=64) as llm:
            r = llm.generate("hello", max_tokens=3, ignore_eos=True)
            assert len(r.tokens) == 3
