"""The draft sources behind one interface (csrc/draft_source.h): a pair holds them
in llama.cpp's fixed priority order whatever order the speculative list gives,
each step says who drafted as a DraftKind (bound through pybind11) whose
llama.cpp name is the step's ``source``, and what the pair says of its model
drafter comes from that drafter's source."""

from __future__ import annotations

import pytest

from pydflash import Llama, _core, gguf_writers
from support.models import TARGET
from support.ngram import SMALL

K = _core.DraftKind
PROMPT = [300, 12, 12, 7, 300, 12]  # a loop the tiny random target soon repeats (tests/test_ngram.py)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return gguf_writers.write_pair(tmp_path_factory.mktemp("sources"), TARGET)  # the target, a DFlash drafter


def test_the_kinds_are_llama_cpps_spec_types():
    kinds = list(K.__members__.values())
    names = [k.spec_type for k in kinds]
    assert len(set(names)) == len(kinds)  # one name each
    assert K.NONE.spec_type == "" and K.EXTERNAL.spec_type == "external"
    drafting = {n for k, n in zip(kinds, names, strict=True) if k not in (K.NONE, K.EXTERNAL)}
    # every other kind is a --spec-type name the options accept
    assert drafting <= set(_core.SPECULATIVE_TYPES)
    assert {"ngram-mod", "draft-dflash", "draft-mtp"} <= drafting


@pytest.mark.parametrize(
    ("given", "order"),
    [
        (["draft-dflash", "ngram-mod", "ngram-simple"], [K.EXTERNAL, K.NGRAM_SIMPLE, K.NGRAM_MOD, K.DRAFT_DFLASH]),
        (["ngram-cache", "ngram-map-k"], [K.EXTERNAL, K.NGRAM_MAP_K, K.NGRAM_CACHE]),
        ([], [K.EXTERNAL, K.DRAFT_DFLASH]),  # the drafter alone
    ],
)
def test_the_sources_are_held_in_llama_cpps_priority_order(models, given, order):
    target, drafter = models
    model = drafter if K.DRAFT_DFLASH in order else None
    with Llama(target, draft=model, speculative=given, ngram=SMALL, n_ctx=256) as llm:
        assert llm._engine._core.draft_sources == order


def test_a_target_alone_has_only_the_callers_drafts(models):
    target, _ = models
    with Llama(target, n_ctx=256) as llm:
        core = llm._engine._core
        assert core.draft_sources == [K.EXTERNAL]
        assert (core.drafter_kind, core.max_draft, core.default_draft_max, core.block_size) == ("", 0, 0, 0)
        llm.pair.prefill(PROMPT)
        r = llm.pair.step()
        assert (r.kind, r.source, r.n_drafted) == (K.NONE, "", 0)


def test_each_step_names_its_source_by_kind(models):
    target, drafter = models
    with Llama(target, draft=drafter, speculative=["ngram-mod", "draft-dflash"], ngram=SMALL, n_ctx=512) as llm:
        pair = llm.pair
        assert llm._engine._core.drafter_kind == "dflash" and pair.max_draft == llm._engine._core.block_size - 1
        pair.prefill(PROMPT)
        seen = set()
        for _ in range(30):
            r = pair.step(pair.max_draft)
            assert (r.n_drafted > 0) == (r.kind != K.NONE)
            seen.add(r.kind)
        # both sources drafted: the n-gram where it found the loop, the drafter elsewhere
        assert {K.NGRAM_MOD, K.DRAFT_DFLASH} <= seen
        r = pair.step(draft=[1, 2])
        assert (r.kind, r.source, r.drafted) == (K.EXTERNAL, "external", [1, 2])
        r = pair.step(draft=[])  # an empty draft of the caller's is still the caller's
        assert (r.kind, r.n_drafted) == (K.EXTERNAL, 0)
        r = pair.step(0)
        assert (r.kind, r.source) == (K.NONE, "")
