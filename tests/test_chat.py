"""create_completion / create_chat_completion: OpenAI-shaped results, chat
templates through llama.cpp (jinja, built-in names, the ChatML fallback),
reasoning on/off, streaming, timings with the draft counts, typed errors."""

from __future__ import annotations

import dataclasses
import time

import pytest

from pydflash import ChatTemplateError, Llama, gguf_writers
from pydflash.engine.channel import EngineOutput
from pydflash.openai.chat import ChatReply, ChatTemplate, builtin_templates
from pydflash.openai.completions import chat_prompt_tokens
from pydflash.openai.types import ChatCompletion, ChatCompletionChunk, Completion, Timings
from support.models import TARGET

MSGS = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def f():"}]
GREEDY = dict(temperature=0.0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def chat_llm(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("chat")
    t = gguf_writers.write_target(d / "target-chat.gguf",
                             dataclasses.replace(TARGET, chat_template=gguf_writers.THINKING_TEMPLATE))
    with Llama(t, draft=model_dir / "drafter-b8.gguf", n_ctx=1024) as llm:
        yield llm


def test_model_template_renders_through_llama_cpp(chat_llm):
    p = chat_llm.apply_chat_template(MSGS)
    assert p.prompt == ("<|im_start|>system\nYou write Python.<|im_end|>\n"
                        "<|im_start|>user\ndef f():<|im_end|>\n<|im_start|>assistant\n")
    assert p.stop == ()  # the model has its own template: no ChatML fallback stop added
    no_gen = chat_llm.apply_chat_template(MSGS, add_generation_prompt=False)
    assert not no_gen.prompt.endswith("assistant\n")


def test_enable_thinking_switch_reaches_the_template(chat_llm):
    on = chat_llm.apply_chat_template(MSGS, enable_thinking=True).prompt
    off = chat_llm.apply_chat_template(MSGS, enable_thinking=False).prompt
    assert "<think>" not in on
    assert off == on + "<think>\n\n</think>\n\n"


def test_reasoning_is_split_from_content():
    t = ChatTemplate(None, gguf_writers.THINKING_TEMPLATE)
    assert t.supports_thinking
    on = t.apply([{"role": "user", "content": "hi"}])
    assert on.supports_thinking and on.thinking_start_tag == "<think>" and on.thinking_end_tags == ("</think>",)
    reply = ChatTemplate.parse("<think>\nlet me see\n</think>\n\nthe answer", on)
    assert (reply.reasoning_content.strip(), reply.content) == ("let me see", "the answer")
    assert ChatTemplate.parse("the answer", on) == ChatReply("the answer", "", ())
    partial = ChatTemplate.parse("<think>\nlet me", on, partial=True)  # streaming: reasoning so far
    assert (partial.reasoning_content, partial.content) == ("let me", "")
    # thinking off: the template closed the block itself; nothing is taken as reasoning
    off = t.apply([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert off.generation_prompt.endswith("</think>\n\n")
    assert ChatTemplate.parse("the answer", off).content == "the answer"
    # past reasoning is rendered back into the prompt
    past = t.apply([{"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b", "reasoning_content": "r"},
                    {"role": "user", "content": "c"}])
    assert "<|im_start|>assistant\n<think>\nr\n</think>\n\nb<|im_end|>" in past.prompt


def test_embedded_pair_without_template_uses_chatml():
    import pydflash

    t, d = pydflash.embedded_pair()
    with Llama(t, draft=d, n_ctx=512) as llm:
        assert "tokenizer.chat_template" not in llm.metadata
        p = llm.apply_chat_template([{"role": "user", "content": "hi"}])
        assert p.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert "<|im_end|>" in p.stop
        res = llm.create_chat_completion([{"role": "user", "content": "def add(a, b):"}], max_tokens=24,
                                         temperature=0.0)
        assert res["choices"][0]["message"]["role"] == "assistant"
        assert "<|im_end|>" not in res["choices"][0]["message"]["content"]
        assert res["usage"]["completion_tokens"] <= 24


def test_builtin_named_template(tmp_path, target_path):
    assert "llama3" in builtin_templates() and "chatml" in builtin_templates()
    with Llama(target_path, chat_template="llama3", n_ctx=256) as llm:
        p = llm.apply_chat_template([{"role": "user", "content": "hi"}]).prompt
        assert "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>" in p
        assert p.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_explicit_jinja_template_with_bos(target_path):
    src = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | upper }}\n{% endfor %}>>"
    with Llama(target_path, chat_template=src, n_ctx=256) as llm:
        assert llm.apply_chat_template([{"role": "user", "content": "hi"}]).prompt.endswith("[user] HI\n>>")


def test_chat_completion_equals_generate(chat_llm):
    dm = chat_llm.pair.max_draft  # the stats are compared: fixed draft lengths
    res = chat_llm.create_chat_completion(MSGS, draft_max=dm, **GREEDY)
    prompt = chat_llm.apply_chat_template(MSGS).prompt
    want = chat_llm.generate(prompt, max_tokens=20, ignore_eos=True, draft_max=dm)
    assert set(res) == set(ChatCompletion.__annotations__)
    assert res["object"] == "chat.completion" and res["id"].startswith("chatcmpl-")
    assert res["model"] == "target-chat.gguf"
    choice = res["choices"][0]
    assert choice["message"]["content"] == want.text
    assert choice["finish_reason"] == "length"
    assert res["usage"] == {"prompt_tokens": want.stats.prompt_tokens, "completion_tokens": 20,
                            "total_tokens": want.stats.prompt_tokens + 20}
    tm = res["timings"]
    assert set(tm) == set(Timings.__annotations__)
    assert tm["draft_n"] == want.stats.n_drafted and tm["draft_n_accepted"] == want.stats.n_accepted
    assert tm["n_steps"] == want.stats.n_steps and sum(res["speculative"]["accepted_lengths"]) == tm["draft_n_accepted"]
    assert tm["predicted_n"] == 20 and tm["prompt_n"] == want.stats.prompt_tokens


def test_chat_stream_matches_non_stream(chat_llm):
    dm = chat_llm.pair.max_draft  # the stats are compared: fixed draft lengths
    full = chat_llm.create_chat_completion(MSGS, draft_max=dm, **GREEDY)
    chunks = list(chat_llm.create_chat_completion(MSGS, stream=True, draft_max=dm, **GREEDY))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}  # as llama-cpp-python (the server adds content null)
    for c in chunks:
        assert c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"]
        assert set(c) <= set(ChatCompletionChunk.__annotations__)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == full["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks].count("length") == 1
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == full["usage"]
    assert last["timings"]["draft_n"] == full["timings"]["draft_n"]
    assert last["timings"]["draft_n_accepted"] == full["timings"]["draft_n_accepted"]


def test_completion_equals_generate(dflash_b8, baseline):
    want = baseline.generate("x = 1", max_tokens=16, ignore_eos=True)
    # whole blocks pinned: on this compute-bound tiny pair the adaptive length may rightly draft
    # nothing, more so after earlier tests on the same shared Llama stopped it (CI saw draft_n 0)
    res = dflash_b8.create_completion("x = 1", max_tokens=16, temperature=0.0, ignore_eos=True,
                                      draft_max=dflash_b8.pair.max_draft)
    assert set(res) == set(Completion.__annotations__)
    assert res["object"] == "text_completion" and res["id"].startswith("cmpl-")
    assert res["choices"][0]["text"] == want.text
    assert res["usage"]["completion_tokens"] == 16
    assert res["timings"]["draft_n"] > 0
    assert res["timings"]["draft_n_accepted"] <= res["timings"]["draft_n"]
    echo = dflash_b8("x = 1", max_tokens=16, temperature=0.0, ignore_eos=True, echo=True)  # __call__
    assert echo["choices"][0]["text"] == "x = 1" + want.text


def test_completion_stream_and_stop(dflash_b8, baseline):
    want = baseline.generate("def f():", max_tokens=24, ignore_eos=True).text
    chunks = list(dflash_b8.create_completion("def f():", max_tokens=24, temperature=0.0, ignore_eos=True,
                                              stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == want
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[-1]
    assert all("usage" not in c for c in chunks[:-1])
    stop = want[5:8]
    res = dflash_b8.create_completion("def f():", max_tokens=24, temperature=0.0, ignore_eos=True, stop=[stop])
    assert res["choices"][0]["text"] == want[:want.index(stop)]
    assert res["choices"][0]["finish_reason"] == "stop"


def test_stream_closed_early_frees_the_model(dflash_b8, baseline):
    it = dflash_b8.create_completion("def f():", max_tokens=64, temperature=0.0, ignore_eos=True, stream=True)
    next(it)
    it.close()
    want = baseline.generate("y", max_tokens=8, ignore_eos=True)
    assert dflash_b8.generate("y", max_tokens=8, ignore_eos=True).tokens == want.tokens


def test_cancel_stops_between_steps(dflash_b8, target_path, monkeypatch):
    from pydflash import GenerationInterrupted
    from pydflash.engine import engine as _engine
    from pydflash.engine.generation import CANCEL_POLL_S, Generation

    # a stream's cancel is asked before its prompt is evaluated, then after each event it
    # reads: a step, or a run of plain steps (here the shortest: two steps)
    monkeypatch.setattr(_engine, "STREAM_RUN_MS", 1e-3)
    calls = []
    it = dflash_b8.create_completion("def f():", max_tokens=64, temperature=0.0, ignore_eos=True, stream=True,
                                     cancel=lambda: calls.append(1) or len(calls) >= 3)
    with pytest.raises(GenerationInterrupted):
        for _ in it:
            pass
    assert len(calls) == 3  # stopped after its second event
    # a whole reply is not read step by step (its reader sleeps until the end): its cancel
    # is asked before the prompt is evaluated, then every CANCEL_POLL_S while it runs (4,000
    # plain steps, ~2.5 s here; CI once saw 400 drafted tokens end before the second poll)
    asks: list[float] = []
    made: list[Generation] = []  # the generations made (the engine's record of what each made)
    init = Generation.__init__
    monkeypatch.setattr(Generation, "__init__", lambda self, *a, **k: (init(self, *a, **k), made.append(self))[0])
    with Llama(target_path, n_ctx=4096) as llm:
        with pytest.raises(GenerationInterrupted):
            llm.create_completion("def f():", max_tokens=4000, temperature=0.0, ignore_eos=True,
                                  cancel=lambda: asks.append(time.monotonic()) or len(asks) >= 3)
        # the engine has let go of it once the next generation runs; then the tokens it had
        # made when it stopped are final
        assert len(llm.generate("x", max_tokens=2, ignore_eos=True).tokens) == 2
    assert len(asks) == 3 and asks[2] - asks[1] >= 0.9 * CANCEL_POLL_S
    (gen, _) = made
    # what it made: the tokens its reader took, and those the engine counted in the outputs
    # it sent that nobody read (a cancelled reader stops reading)
    unread = gen.channel.until_end(60) or []
    n_made = len(gen.tokens) + sum(sum(o.kept) for o in unread if isinstance(o, EngineOutput))
    assert gen.cancelled and 0 < n_made < 4000, n_made  # stopped at a step, not at the end
    assert len(dflash_b8.generate("y", max_tokens=4, ignore_eos=True).tokens) == 4  # still usable


def test_draft_controls_reach_completions(dflash_b8, baseline, chat_llm):
    # a block shorter than draft_min is dropped (no draft at all with 100); draft_p_min=1
    # cuts a block at the first token the drafter is not certain of (the random drafter
    # is very peaked: some blocks survive, fewer tokens are drafted; on the chat prompt it
    # is certain throughout, so there chat takes draft_min's effect and the bad values of
    # test_bad_draft_controls_in_completions); the text stays the target's own
    want = baseline.generate("x = 1", max_tokens=16, ignore_eos=True).text
    kw = dict(max_tokens=16, temperature=0.0, ignore_eos=True, draft_max=7)  # cuts of the whole block
    full = dflash_b8.create_completion("x = 1", **kw)["timings"]["draft_n"]
    res = dflash_b8.create_completion("x = 1", draft_min=100, **kw)
    assert res["choices"][0]["text"] == want and res["timings"]["draft_n"] == 0 < full
    res = dflash_b8.create_completion("x = 1", draft_p_min=1.0, **kw)
    assert res["choices"][0]["text"] == want and res["timings"]["draft_n"] < full
    full_chat = chat_llm.create_chat_completion(MSGS, **GREEDY)
    cut = chat_llm.create_chat_completion(MSGS, draft_min=100, **GREEDY)
    assert cut["choices"][0]["message"] == full_chat["choices"][0]["message"]
    assert cut["timings"]["draft_n"] == 0 < full_chat["timings"]["draft_n"]


@pytest.mark.parametrize("control, exc", [
    ({"draft_p_min": 1.5}, ValueError),
    ({"draft_p_min": "high"}, TypeError),
    ({"draft_min": -1}, ValueError),
    ({"draft_min": 2.5}, TypeError),
])
def test_bad_draft_controls_in_completions(chat_llm, control, exc):
    name = next(iter(control))
    with pytest.raises(exc, match=name):
        chat_llm.create_completion("x", max_tokens=2, **control)
    with pytest.raises(exc, match=name):
        chat_llm.create_chat_completion(MSGS, max_tokens=2, **control)


@pytest.mark.parametrize("src, words", [
    ("{% if %}", "does not parse"),
    ("{{ raise_exception('no system messages here') }}", "no system messages here"),
    ("{% for m in messages %}{{ m.content | no_such_filter }}{% endfor %}", "chat template failed"),
])
def test_template_errors_are_typed(target_path, baseline, src, words):
    with pytest.raises(ChatTemplateError, match=words), Llama(target_path, chat_template=src, n_ctx=256) as llm:
        llm.create_chat_completion(MSGS, max_tokens=4)
    assert issubclass(ChatTemplateError, ValueError)


def test_template_error_leaves_the_model_usable(target_path):
    with Llama(target_path, chat_template="{{ raise_exception('nope') }}", n_ctx=256) as llm:
        with pytest.raises(ChatTemplateError, match="nope"):
            llm.create_chat_completion(MSGS, max_tokens=4)
        assert llm.create_completion("x", max_tokens=4, temperature=0.0, ignore_eos=True)["usage"][
            "completion_tokens"] == 4


@pytest.mark.parametrize("messages, exc", [
    ("hello", TypeError),
    ([{"content": "no role"}], ValueError),
    ([{"role": "user", "content": 5}], TypeError),
    (["not a dict"], TypeError),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], ValueError),
])
def test_bad_messages(chat_llm, messages, exc):
    with pytest.raises(exc):
        chat_llm.create_chat_completion(messages, max_tokens=4)


def test_no_messages_is_the_generation_prompt_alone(chat_llm):
    # as llama-server: an empty conversation is rendered, not refused
    cp = chat_llm.apply_chat_template([])
    assert cp.prompt == cp.generation_prompt != ""
    assert chat_llm.create_chat_completion([], max_tokens=2, ignore_eos=True)["usage"]["completion_tokens"] == 2


def test_unsupported_options_are_refused(chat_llm):
    with pytest.raises(ValueError, match="top_logprobs needs logprobs=True"):
        chat_llm.create_chat_completion(MSGS, max_tokens=4, top_logprobs=2)
    with pytest.raises(ValueError, match="suffix"):
        chat_llm.create_completion("x", suffix="y")
    with pytest.raises(ValueError, match="logit_bias"):
        chat_llm.create_completion("x", logit_bias={"a": 1.0})


def test_text_content_parts_and_template_kwargs(chat_llm):
    parts = [{"role": "user", "content": [{"type": "text", "text": "def f():"}]}]
    p = chat_llm.apply_chat_template(parts)
    assert "def f():" in p.prompt
    res = chat_llm.create_chat_completion(parts, chat_template_kwargs={"enable_thinking": False}, **GREEDY)
    prompt_off = chat_llm.apply_chat_template(parts, enable_thinking=False).prompt
    assert res["usage"]["prompt_tokens"] == len(chat_llm.tokenize(prompt_off))


JINJA_BOS = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>>"


@pytest.mark.parametrize("source", [None, "llama3", "chatml", JINJA_BOS, gguf_writers.THINKING_TEMPLATE],
                         ids=["chatml-fallback", "llama3", "chatml", "jinja-bos", "thinking"])
def test_template_tokens_are_the_ids_of_its_text(target_path, source):
    # the core tokenizes the rendered prompt in the call that renders it: the ids the two-step
    # path (the text back to Python, then tokenized) gives, special tokens and BOS alike
    convs = [(MSGS, {}), ([{"role": "user", "content": "<|im_start|> x <|im_end|>"}], {}),
             (MSGS, {"add_generation_prompt": False}), ([], {})]
    with Llama(target_path, chat_template=source, n_ctx=256) as llm:
        for messages, kw in convs:
            cp = llm.apply_chat_template(messages, **kw)
            assert cp.tokens is not None
            assert list(cp.tokens) == llm.tokenize(cp.prompt, special=True)
            assert chat_prompt_tokens(llm, cp) == llm.prompt_tokens(cp.prompt)


def test_chat_completion_reads_the_templates_tokens(chat_llm, monkeypatch):
    cp = chat_llm.apply_chat_template(MSGS)
    want = chat_llm.create_chat_completion(MSGS, **GREEDY)
    assert want["usage"]["prompt_tokens"] == len(chat_llm.prompt_tokens(cp.prompt))

    checked = chat_llm.prompt_tokens

    def ids_only(prompt):  # ids are checked against the vocabulary; text would be tokenized again
        assert not isinstance(prompt, (str, bytes)), f"the chat prompt went back to be tokenized: {prompt!r}"
        return checked(prompt)

    monkeypatch.setattr(chat_llm, "prompt_tokens", ids_only)
    got = chat_llm.create_chat_completion(MSGS, **GREEDY)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["usage"] == want["usage"]


def test_a_template_without_a_model_gives_text_and_no_tokens():
    cp = ChatTemplate(None, gguf_writers.THINKING_TEMPLATE).apply([{"role": "user", "content": "hi"}])
    assert cp.prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert cp.tokens is None
