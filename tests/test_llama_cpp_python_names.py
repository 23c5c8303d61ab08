"""llama-cpp-python's names an app passes through (issue #64): ``LlamaGrammar``, a grammar
object in the completions, ``set_cache`` with ``LlamaRAMCache``/``LlamaDiskCache``, and the
``Llama(...)`` keywords ``n_ctx=0``, ``tensor_split=None``, ``offload_kqv``, ``numa``,
``lora_path``; a test with each, on the shipped pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pydflash
from pydflash import Llama, LlamaDiskCache, LlamaGrammar, LlamaRAMCache, LlamaState  # llama_cpp's names

TARGET, DRAFTER = pydflash.embedded_pair()
YES_NO = 'root ::= "yes" | "no"'
MSGS = [{"role": "user", "content": "Is this Python?"}]


@pytest.fixture(scope="module")
def llm():
    with Llama(model_path=TARGET, draft_model=DRAFTER, n_ctx=512, n_threads=1) as llm:
        yield llm


def test_llama_grammar_constructors_and_every_call_that_takes_one(llm, tmp_path: Path):
    g = LlamaGrammar.from_string(YES_NO, verbose=False)
    assert isinstance(g, pydflash.Grammar)
    assert llm.generate("x", max_tokens=4, grammar=g).text in ("yes", "no")
    assert llm.create_completion("x", max_tokens=4, grammar=g)["choices"][0]["text"] in ("yes", "no")
    chat = llm.create_chat_completion(MSGS, max_tokens=4, temperature=0, grammar=g)
    assert chat["choices"][0]["message"]["content"] in ("yes", "no")
    (tmp_path / "g.gbnf").write_text(YES_NO)
    assert LlamaGrammar.from_file(tmp_path / "g.gbnf").gbnf == YES_NO
    js = LlamaGrammar.from_json_schema(json.dumps({"enum": ["yes", "no"]}))
    reply = llm.create_chat_completion(MSGS, max_tokens=8, temperature=0, grammar=js)
    assert json.loads(reply["choices"][0]["message"]["content"]) in ("yes", "no")
    with pytest.raises(ValueError, match="does not parse"):
        LlamaGrammar.from_string("root ::= (")


def _prompt_cached(res: dict) -> int:
    return res["timings"]["cache_n"]


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_set_cache_restores_the_longest_cached_prefix(llm, tmp_path: Path, kind: str):
    cache = LlamaRAMCache() if kind == "ram" else LlamaDiskCache(tmp_path / "cache")
    a, b = "def fibonacci(n):\n    ", "import os\nimport sys\n"
    llm.set_cache(cache)
    try:
        first = llm.create_completion(a, max_tokens=8, temperature=0)
        assert len(cache.keys()) == 1 and cache.cache_size > 0
        (key,) = cache.keys()
        assert key[: len(llm.tokenize(a.encode()))] == tuple(llm.tokenize(a.encode()))
        assert isinstance(cache[llm.tokenize(a.encode())], LlamaState)
        llm.create_completion(b, max_tokens=8, temperature=0)  # the sequence now holds b
        assert len(cache.keys()) == 2
        again = llm.create_completion(a, max_tokens=8, temperature=0)
        n_prompt = len(llm.tokenize(a.encode()))
        assert _prompt_cached(again) >= n_prompt - 1  # a's state came back from the cache
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        chunks = list(llm.create_chat_completion(MSGS, max_tokens=4, temperature=0, stream=True))
        assert chunks and len(cache.keys()) == 3  # a stream's state is saved once it ends
    finally:
        llm.set_cache(None)
    if kind == "disk":  # another process finds them
        assert LlamaDiskCache(tmp_path / "cache").keys() == cache.keys()
    llm.create_completion(b, max_tokens=2, temperature=0)
    assert len(cache.keys()) == 3  # no cache set: nothing saved


def test_a_cache_evicts_the_least_recently_used_past_its_capacity(tmp_path: Path):
    def state(n: int) -> LlamaState:
        return LlamaState(np.arange(n, dtype=np.intc), n, b"x" * 100, 100, -1)

    for cache in (LlamaRAMCache(capacity_bytes=250), LlamaDiskCache(tmp_path, capacity_bytes=1 << 20)):
        cache[[1, 2, 3]] = state(3)
        cache[[1, 2, 4, 5]] = state(4)
        assert cache[[1, 2, 4, 5, 6]].n_tokens == 4  # the longest shared prefix
        assert cache[[1, 2, 3, 9]].n_tokens == 3  # ... and now the most recently used
        with pytest.raises(KeyError):
            cache[[7]]
        assert [7] not in cache and [1] in cache
    ram = LlamaRAMCache(capacity_bytes=250)
    for i in range(3):
        ram[[i]] = state(1)
    assert ram.keys() == [(1,), (2,)] and ram.cache_size == 200


def test_set_cache_takes_a_cache_for_one_sequence(llm):
    with pytest.raises(TypeError, match="LlamaRAMCache"):
        llm.set_cache({})
    with Llama(TARGET, n_ctx=256, n_parallel=2, n_threads=1) as two, pytest.raises(ValueError, match="n_parallel"):
        two.set_cache(LlamaRAMCache())


def test_n_ctx_0_is_the_models_own_context():
    with Llama(model_path=TARGET, n_ctx=0, n_threads=1) as llm:
        arch = llm.metadata["general.architecture"]
        assert llm.n_ctx() == int(llm.metadata[f"{arch}.context_length"]) == llm.n_ctx_slot
        assert llm.generate("x", max_tokens=2).tokens


def test_device_keywords_of_llama_cpp_python():
    with Llama(model_path=TARGET, n_ctx=128, tensor_split=None, offload_kqv=False, numa=False, n_threads=1) as llm:
        assert llm.config.tensor_split == () and llm.config.offload_kqv is False
        assert llm.generate("x", max_tokens=2).tokens  # KV in host memory: on a CPU build, where it is anyway
    from pydflash.cli import build_parser
    from pydflash.cli.common import llama_options

    assert llama_options(build_parser().parse_args(["generate", "-nkvo"]))["offload_kqv"] is False  # llama.cpp's
    with pytest.raises(TypeError, match="numa"):
        Llama(TARGET, numa="yes")
    with pytest.raises(ValueError, match="numa"):
        Llama(TARGET, numa=9)


def test_numa_is_set_once_per_process():
    # its own process: llama.cpp's NUMA placement stays for the process's life
    code = ("import warnings, pydflash; from pydflash import Llama, _core\n"
            "t, _ = pydflash.embedded_pair()\n"
            "with Llama(t, n_ctx=64, numa=True, n_threads=1): pass\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    with Llama(t, n_ctx=64, numa=2, n_threads=1): pass\n"
            "print(_core.init_numa(0), len(w), 'once' in str(w[0].message))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "True"]  # distribute, and the second ask warned


def test_lora_keywords_none_is_accepted_a_path_is_refused_by_name(tmp_path: Path):
    with Llama(model_path=TARGET, n_ctx=64, lora_path=None, lora_base=None, lora_scale=1.0, n_threads=1) as llm:
        assert llm.generate("x", max_tokens=1).tokens
    adapter = tmp_path / "adapter.gguf"
    adapter.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"lora_path=.*LoRA adapters are not supported"):
        Llama(model_path=TARGET, lora_path=str(adapter))
    with pytest.raises(ValueError, match="lora_base"):
        Llama(model_path=TARGET, lora_base=str(adapter))
