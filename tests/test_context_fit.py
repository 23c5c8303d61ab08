"""A context that cannot fit is refused with what it needs, before llama.cpp tries
to allocate it (which ended in ``std::bad_alloc`` after minutes of paging)."""

from __future__ import annotations

import pytest

import pydflash
from pydflash import ContextLimitError, Llama
from pydflash.config import ModelConfig
from pydflash.fit import kv_cache_bytes


def test_a_huge_context_is_refused_at_once_with_its_size():
    t, d = pydflash.embedded_pair()
    # pydflash's estimate refuses it before llama.cpp allocates anything (without it llama.cpp
    # tries, and the test's timeout fails it): the message is the estimate's
    with pytest.raises(ContextLimitError, match=r"does not fit: n_ctx=1000000000 needs about [0-9.]+ GiB"):
        Llama(t, draft=d, n_ctx=10**9)
    with Llama(t, n_ctx=256) as llm:  # the process is fine afterwards
        assert llm.generate("x", max_tokens=2, ignore_eos=True).tokens


def test_the_estimate_follows_llama_cpp_kv_cache(target_path):
    with Llama(target_path, n_ctx=512) as llm:
        got = sum(row.context for row in llm.memory().rows if row.role == "target")
        want = kv_cache_bytes(llm.core_model, ModelConfig(n_ctx=512))
    assert want is not None and want == pytest.approx(got, rel=0.05)
