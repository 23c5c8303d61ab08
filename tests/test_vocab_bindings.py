"""Vocabulary facts llama.cpp already knows, read through the bindings rather than
redone in Python: the FIM tokens (``llama_vocab_fim_*``), the end-of-generation
tokens (``llama_vocab_is_eog`` over the vocabulary) and the pieces of many tokens in
one call. Tiny targets whose GGUF declares FIM tokens and an EOT token."""

from __future__ import annotations

import dataclasses

import pytest

from pydflash import Llama, _core, gguf_writers
from pydflash.server.native import fim_tokens
from support.models import TARGET

ALL = ("pre", "suf", "mid", "pad", "rep", "sep")
FORCE = 1e4  # a logit bias that picks its token: the tiny random model's logits span over 100


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("vocab")
    fim = dataclasses.replace(TARGET, fim=ALL)
    # EOT: the last (unused) token, so that only the declaration makes it one
    eot = {"tokenizer.ggml.eot_token_id": TARGET.n_vocab - 1}
    return {
        "plain": str(gguf_writers.write_target(d / "plain.gguf", TARGET)),
        "fim": str(gguf_writers.write_target(d / "fim.gguf", fim, extra_kv=eot)),
    }


@pytest.fixture(scope="module")
def fim_llm(paths):
    with Llama(paths["fim"], n_ctx=128) as llm:
        yield llm


def declared_fim(path: str) -> dict[str, int]:
    meta = _core.inspect_gguf(path)["metadata"]
    return {part: int(meta[f"tokenizer.ggml.fim_{part}_token_id"]) for part in ALL}


def test_fim_tokens_are_the_ids_the_gguf_declares(paths, fim_llm):
    want = declared_fim(paths["fim"])
    assert fim_llm.core_model.fim_tokens() == want
    for part, t in want.items():  # and the texts they stand for
        assert fim_llm.core_model.token_to_piece(t, True).decode() == gguf_writers.FIM_TOKENS[part]
    # the server's helper reads the binding: the five the infill prompt uses
    assert fim_tokens(fim_llm) == {p: t for p, t in want.items() if p != "pad"}


def test_a_vocabulary_without_fim_tokens_has_none(paths):
    with Llama(paths["plain"], n_ctx=64) as llm:
        assert llm.core_model.fim_tokens() == {}
        assert fim_tokens(llm) == {}


def test_eog_tokens_are_what_llama_cpp_says(fim_llm):
    model = fim_llm.core_model
    eog = model.eog_tokens()
    assert eog == [t for t in range(model.n_vocab) if model.is_eog(t)]
    fim = model.fim_tokens()
    # EOS, the declared EOT, and the FIM tokens llama.cpp counts as ends (pad, repo, file separator)
    assert set(eog) == {model.eos, model.n_vocab - 1, fim["pad"], fim["rep"], fim["sep"]}


def test_generation_stops_at_each_eog_token(fim_llm):
    for t in fim_llm.core_model.eog_tokens():
        res = fim_llm.generate("hello", max_tokens=8, temperature=0, logit_bias={t: FORCE})
        assert res.finish_reason == "eos" and res.tokens == [], t
        kept = fim_llm.generate("hello", max_tokens=3, temperature=0, logit_bias={t: FORCE}, ignore_eos=True)
        assert kept.tokens == [t] * 3


def test_token_pieces_are_the_pieces_of_each_token(fim_llm):
    model = fim_llm.core_model
    ids = list(range(model.n_vocab))
    for special in (False, True):
        assert model.token_pieces(ids, special) == [model.token_to_piece(t, special) for t in ids]
    assert model.token_pieces([]) == []
    assert model.token_pieces(range(3)) == [model.token_to_piece(t) for t in range(3)]


@pytest.mark.parametrize("bad", [-1, TARGET.n_vocab])
def test_token_pieces_refuse_an_id_out_of_range(fim_llm, bad):
    with pytest.raises(ValueError, match=f"token id {bad} is out of range"):
        fim_llm.core_model.token_pieces([0, bad, 1])
    assert fim_llm.core_model.token_pieces([0]) == [fim_llm.core_model.token_to_piece(0)]  # still usable
