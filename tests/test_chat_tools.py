"""Tool calls and reasoning through the real generation path: a tiny target
whose vocabulary has whole phrases as single (user-defined) tokens, so a
logit_bias makes the greedy model write a tool call, or reasoning then an
answer, deterministically; the template renders tools and tool calls in the
Hermes / Qwen3 way, so llama.cpp's template analysis finds the call format.
Checked in create_chat_completion, its stream, and over HTTP."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import pytest

from pydflash import GrammarError, Llama
from support.phrases import FORCED_TEMPLATE

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
MSGS = [{"role": "user", "content": "Weather in Paris?"}]

@pytest.fixture(scope="module")
def llm(phrase_files):
    with Llama(phrase_files[0], draft=phrase_files[1], n_ctx=2048) as m:
        yield m


def force(ids, *names) -> dict:
    return dict(temperature=0.0, logit_bias={ids[n]: 1000.0 for n in names})


def stream_parts(chunks) -> tuple[str, str, list, str]:
    deltas = [c["choices"][0]["delta"] for c in chunks]
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas),
            [tc for d in deltas for tc in d.get("tool_calls", [])], chunks[-1]["choices"][0]["finish_reason"])


def test_the_lazy_tool_call_grammar_refuses_a_call_outside_the_tools(llm, phrase_files):
    """With tools the template's tool-call grammar applies once a call starts (lazy, as
    in llama-server): a call to a function that was not offered cannot be emitted (here
    one token carries the whole call, so the grammar stops it with GrammarError; with a
    real tokenizer the mask steers the call instead). The model stays usable."""
    ids = phrase_files[2]
    cp = llm.apply_chat_template(MSGS, tools=TOOLS)
    assert cp.grammar and cp.grammar_lazy and (cp.grammar_trigger_patterns or cp.grammar_trigger_tokens)
    assert "get_weather" in cp.grammar
    with pytest.raises(GrammarError, match="grammar"):
        llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=8, **force(ids, "badcall"))
    res = llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=32, **force(ids, "call"))
    assert res["choices"][0]["finish_reason"] == "tool_calls"
    # without tools there is no tool-call grammar: the same text is plain content
    res = llm.create_chat_completion(MSGS, max_tokens=8, **force(ids, "badcall"))
    assert "launch_rockets" in res["choices"][0]["message"]["content"]


@pytest.mark.parametrize("phrase", ["call", "think+call"])
def test_tool_call_whole_and_streamed(llm, phrase_files, phrase):
    ids = phrase_files[2]
    res = llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=1, **force(ids, phrase))
    choice = res["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert choice["message"]["content"] == ""
    want_reasoning = "The user wants the weather." if phrase == "think+call" else ""
    assert choice["message"].get("reasoning_content", "").strip() == want_reasoning
    reasoning, content, calls, finish = stream_parts(list(
        llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=1, stream=True, **force(ids, phrase))))
    assert finish == "tool_calls" and content == ""
    assert reasoning == choice["message"].get("reasoning_content", "")
    assert [(c["index"], c["function"]) for c in calls] == [(0, call["function"])]


NAMED = {"type": "function", "function": {"name": "get_weather"}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_tool_choice_required_or_named_forces_a_call(llm, phrase_files):
    """OpenAI's tool_choice as llama-server reads it: "required" makes the tool-call grammar
    apply from the first token (not lazily), which cannot end before a call: the likeliest
    reply, ending at once, cannot be written and the call is; a named function does the
    same with that tool alone."""
    ids = phrase_files[2]
    opts = dict(temperature=0.0, max_tokens=4, logit_bias={llm.token_eos(): 1000.0, ids["call"]: 998.0})
    auto = llm.create_chat_completion(MSGS, tools=TOOLS, **opts)
    assert auto["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in auto["choices"][0]["message"]
    for choice in ("required", NAMED):
        res = llm.create_chat_completion(MSGS, tools=TOOLS, tool_choice=choice, **opts)
        assert res["choices"][0]["finish_reason"] == "tool_calls", choice
        (call,) = res["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        *_, calls, finish = stream_parts(list(llm.create_chat_completion(
            MSGS, tools=TOOLS, tool_choice=choice, stream=True, **opts)))
        assert finish == "tool_calls" and [c["function"]["name"] for c in calls] == ["get_weather"]
    cp = llm.apply_chat_template(MSGS, tools=TOOLS, tool_choice="required")
    assert cp.grammar and not cp.grammar_lazy
    # a named function: the template and the grammar offer that tool alone
    named = llm.apply_chat_template(MSGS, tools=[TIME, *TOOLS], tool_choice=NAMED)
    assert "get_time" not in named.prompt + named.grammar and "get_weather" in named.grammar
    # "none": the tools are shown (as llama-server's template shows them), no call is read
    none = llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=1, tool_choice="none", **force(ids, "call"))
    assert none["choices"][0]["finish_reason"] == "length" and "get_weather" in none["choices"][0]["message"]["content"]
    assert "get_weather" in llm.apply_chat_template(MSGS, tools=TOOLS, tool_choice="none").prompt


@pytest.mark.parametrize("choice, error", [
    ("sometimes", "auto, none, required"), ({"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    ({"type": "function"}, "names a function"), (3, "str or a dict"),
])  # fmt: skip
def test_a_bad_tool_choice_is_refused(llm, choice, error):
    with pytest.raises((TypeError, ValueError), match=error):
        llm.create_chat_completion(MSGS, tools=TOOLS, max_tokens=1, tool_choice=choice)
    assert llm.create_chat_completion(MSGS, max_tokens=1)["choices"][0]["finish_reason"] == "length"  # still usable


def test_without_tools_the_call_is_plain_content(llm, phrase_files):
    # the same text with no tools= offered: the template has no tool section
    res = llm.create_chat_completion(MSGS, max_tokens=1, **force(phrase_files[2], "think+answer"))
    msg = res["choices"][0]["message"]
    assert "tool_calls" not in msg and res["choices"][0]["finish_reason"] == "length"
    assert (msg["reasoning_content"].strip(), msg["content"]) == ("The user wants the weather.", "It is sunny.")


def test_reasoning_content_whole_and_streamed_agree_over_many_steps(phrase_files, monkeypatch):
    # reasoning forced open by the template; two biased words and, a little
    # lower, the end of reasoning: a presence penalty makes the greedy model
    # write " alpha beta", then end the reasoning, then answer. The expected
    # split is computed from the raw text of generate(), not by the chat parser
    t, d, ids = phrase_files
    with Llama(t, draft=d, n_ctx=2048, chat_template=FORCED_TEMPLATE) as m:
        prompt = m.apply_chat_template(MSGS).prompt
        assert prompt.endswith("<|im_start|>assistant\n<think>\n")
        opts = dict(max_tokens=8, ignore_eos=True, temperature=0.0, presence_penalty=2.0,
                    logit_bias={ids["w1"]: 1000.0, ids["w2"]: 1000.0, ids["end"]: 998.5})
        raw = m.generate(prompt, **opts).text
        assert raw.count("</think>") == 1, raw
        want_reasoning, want_content = raw.split("</think>", 1)
        assert len(want_reasoning.split()) >= 2 and want_content.strip(), raw  # several steps of each
        res = m.create_chat_completion(MSGS, **opts)
        msg = res["choices"][0]["message"]
        assert msg["reasoning_content"].strip() == want_reasoning.strip()
        assert msg["content"] == want_content.lstrip()
        chunks = list(m.create_chat_completion(MSGS, stream=True, **opts))
        reasoning, content, calls, finish = stream_parts(chunks)
        assert (reasoning, content, calls, finish) == (msg["reasoning_content"], msg["content"], [], "length")
        # one token per step, each its own event (no runs of plain steps): both arrive over
        # several chunks, as they are generated
        from pydflash.engine.engine import Engine

        monkeypatch.setattr(Engine, "_run_max", lambda self, slots: 1)
        chunks = list(m.create_chat_completion(MSGS, stream=True, draft_max=0, **opts))
        assert stream_parts(chunks) == (reasoning, content, [], "length")
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("reasoning_content")) > 1
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) > 1


def test_tool_call_over_http(phrase_files):
    openai = pytest.importorskip("openai")
    t, d, ids = phrase_files
    proc = subprocess.Popen([sys.executable, "-m", "pydflash", "serve", "-m", str(t), "-d", str(d),
                             "--host", "127.0.0.1", "--port", "0", "--n-ctx", "2048"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            m = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            url = m.group(1) if m else None
        assert url, "server did not start"
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        drain.start()
        kw = dict(model="x", messages=MSGS, tools=TOOLS, max_tokens=1, temperature=0,
                  logit_bias={str(ids["think+call"]): 100})
        # (OpenAI's logit_bias range is [-100, 100]; the phrase token wins at 100 too)
        with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120) as client:
            res = client.chat.completions.create(**kw)
            chunks = list(client.chat.completions.create(stream=True, **kw))
        choice = res.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls[0].function.name == "get_weather"
        assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris"}
        assert choice.message.to_dict()["reasoning_content"].strip() == "The user wants the weather."
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [tc.function.name for tc in calls] == ["get_weather"]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()
