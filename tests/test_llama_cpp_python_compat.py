"""A llama-cpp-python program runs with only the import changed and ``draft=`` added.

Each test is a call from llama-cpp-python's README or its ``Llama`` API, on the
shipped pair, checked for the output types and shapes llama-cpp-python documents
and for what the values must be (greedy sampling equals the scores' argmax, a
loaded state continues as the saved one did, ...)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import pydflash
from pydflash import Llama  # was: from llama_cpp import Llama

TARGET, DRAFTER = pydflash.embedded_pair()
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def llm():
    # llama-cpp-python's keywords, plus draft=
    with Llama(model_path=TARGET, draft=DRAFTER, n_ctx=512, embedding=True, seed=1234, verbose=False) as llm:
        yield llm


def test_high_level_completion_as_in_the_readme(llm):
    output = llm("Q: Name the planets in the solar system? A: ", max_tokens=32, stop=["Q:", "\n"], echo=True)
    assert isinstance(output, dict)
    assert output["object"] == "text_completion" and output["id"].startswith("cmpl-")
    assert isinstance(output["created"], int) and isinstance(output["model"], str)
    (choice,) = output["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None
    assert choice["finish_reason"] in ("stop", "length")
    assert choice["text"].startswith("Q: Name the planets in the solar system? A: ")  # echo
    assert "\n" not in choice["text"] and "Q:" not in choice["text"][3:]  # the stops cut it
    usage = output["usage"]
    assert usage["prompt_tokens"] == len(llm.tokenize(b"Q: Name the planets in the solar system? A: "))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 32


def test_chat_completion_and_its_stream(llm):
    messages = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Write a function that adds two numbers."},
    ]
    out = llm.create_chat_completion(messages=messages, max_tokens=24, temperature=0.0)
    assert out["object"] == "chat.completion"
    msg = out["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    chunks = list(llm.create_chat_completion(messages=messages, max_tokens=24, temperature=0.0, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}  # llama-cpp-python's first chunk
    # the idiom of llama-cpp-python's README (and docs/openai.md): no literal "None" first
    text = "".join(str(c["choices"][0]["delta"].get("content", "")) for c in chunks)
    assert text == msg["content"]  # greedy: the stream says what the whole reply said
    assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]


def test_tokenize_and_detokenize_take_and_give_bytes(llm):
    tokens = llm.tokenize(b"Hello, world!")
    assert isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)
    bare = llm.tokenize(b"Hello, world!", False)  # add_bos positionally
    assert llm.tokenize(b"Hello, world!", add_bos=False, special=False) == bare
    assert llm.detokenize(bare) == b"Hello, world!"
    assert isinstance(llm.detokenize(tokens), bytes)
    # special=True reads the end-of-text marker as its token, False as plain text
    eos_text = llm.detokenize([llm.token_eos()], special=True)
    assert llm.tokenize(eos_text, False, True) == [llm.token_eos()]
    assert llm.tokenize(eos_text, False, False) != [llm.token_eos()]


def test_model_facts_are_methods(llm):
    assert llm.n_ctx() == 512
    assert llm.n_vocab() == llm.core_model.n_vocab > 0
    assert llm.n_embd() == llm.core_model.n_embd > 0
    assert llm.core_model.is_eog(llm.token_eos())
    assert isinstance(llm.token_bos(), int)


def test_create_embedding_and_embed(llm):
    res = llm.create_embedding("Hello, world!")
    assert res["object"] == "list" and isinstance(res["model"], str)
    (item,) = res["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    vec = item["embedding"]
    assert isinstance(vec, list) and len(vec) == llm.n_embd() and all(isinstance(x, float) for x in vec)
    n = len(llm.tokenize(b"Hello, world!"))
    assert res["usage"] == {"prompt_tokens": n, "total_tokens": n}
    assert llm.embed("Hello, world!") == vec  # the same text, the same vector
    two = llm.embed(["Hello, world!", "import os"])
    assert len(two) == 2 and two[0] == vec and two[1] != vec
    unit = np.asarray(llm.embed("import os", normalize=True))
    assert abs(float(np.linalg.norm(unit)) - 1.0) < 1e-5


def test_embedding_needs_embedding_true():
    with Llama(TARGET, n_ctx=64) as plain, pytest.raises(pydflash.PyDFlashError, match="embedding=True"):
        plain.embed("x")


def test_reset_eval_sample_follow_the_scores(llm):
    tokens = llm.tokenize(PROMPT.encode())
    llm.reset()
    assert llm.input_ids.tolist() == []
    llm.eval(tokens)
    assert isinstance(llm.input_ids, np.ndarray) and llm.input_ids.tolist() == tokens
    scores = llm.scores
    assert scores.shape == (len(tokens), llm.n_vocab()) and scores.dtype == np.float32
    greedy = llm.sample(temp=0.0)
    assert greedy == int(np.argmax(scores[-1]))
    # the low-level loop of llama-cpp-python's README, token by token, is the greedy output
    out = []
    for _ in range(8):
        tok = llm.sample(top_k=1)
        out.append(tok)
        llm.eval([tok])
    want = llm.generate(tokens, max_tokens=8, temperature=0.0, ignore_eos=True).tokens
    assert out == want
    sampled = llm.sample(top_k=40, top_p=0.95, temp=0.8, repeat_penalty=1.1)
    assert 0 <= sampled < llm.n_vocab()


def test_save_state_and_load_state_continue_as_saved(llm):
    llm.reset()
    llm.eval(llm.tokenize(PROMPT.encode()))
    state = llm.save_state()
    assert isinstance(state, pydflash.LlamaState)
    assert state.n_tokens == len(llm.input_ids) and state.llama_state_size == len(state.llama_state) > 0
    first = llm.generate(llm.input_ids.tolist(), max_tokens=12, temperature=0.0, ignore_eos=True).tokens
    llm.reset()
    llm.eval(llm.tokenize(b"import sys\n"))  # something else in between
    llm.load_state(state)
    assert llm.input_ids.tolist() == state.input_ids.tolist()
    res = llm.generate(state.input_ids.tolist(), max_tokens=12, temperature=0.0, ignore_eos=True)
    assert res.tokens == first
    assert res.stats.cached_tokens >= state.n_tokens - 1  # both caches came back: nothing re-evaluated


def test_set_seed_makes_sampling_repeat(llm):
    llm.set_seed(7)
    a = llm(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]
    llm.set_seed(7)
    b = llm(PROMPT, max_tokens=16, temperature=1.0)["choices"][0]["text"]
    assert a == b


def test_default_seed_is_random():
    with Llama(TARGET, draft=DRAFTER, n_ctx=256) as llm:
        texts = {llm.generate(PROMPT, max_tokens=24, temperature=1.5, top_k=0).text for _ in range(4)}
    assert len(texts) > 1


def test_llama_cpp_python_keywords_are_honoured_or_refused_by_name():
    with Llama(
        model_path=TARGET,
        draft_model=DRAFTER,
        n_ctx=256,
        chat_format="chatml",
        logits_all=True,
        use_mmap=False,
        use_mlock=False,
        n_threads_batch=1,
        n_ubatch=64,
        rope_freq_base=0.0,
        last_n_tokens_size=64,
    ) as llm:
        assert llm.has_draft and llm.config.n_ubatch == 64 and llm.config.use_mmap is False
        assert "<|im_start|>" in llm.apply_chat_template([{"role": "user", "content": "hi"}]).prompt
    with pytest.raises(ValueError, match=r"last_n_tokens_size.*penalty_last_n"):
        Llama(TARGET, last_n_tokens_size=32)
    with pytest.raises(ValueError, match="chat_format"):
        Llama(TARGET, chat_format="no-such-format")
    with pytest.raises(TypeError, match="draft_model"):
        Llama(TARGET, draft_model=object())
    with pytest.raises(TypeError, match="draft"):
        Llama(TARGET, draft=DRAFTER, draft_model=DRAFTER)


def test_misspelt_sampling_keyword_names_the_call(llm):
    with pytest.raises(TypeError, match=r"generate\(\).*temprature"):
        llm.generate(PROMPT, temprature=0.5)
    with pytest.raises(TypeError, match=r"create_completion\(\).*temprature"):
        llm(PROMPT, temprature=0.5)


def test_embedded_pair_reads_naturally():
    with Llama(*pydflash.embedded_pair(), n_ctx=128) as llm:
        assert llm.has_draft


def test_step_past_the_block_clamps_with_a_warning(llm):
    pair = llm.pair
    pair.prefill(llm.tokenize(PROMPT.encode()))
    with pytest.warns(UserWarning, match="draft_max"):
        step = pair.step(draft_max=pair.block_size)
    assert step.n_drafted <= pair.max_draft
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pair.step(draft_max=pair.max_draft)
