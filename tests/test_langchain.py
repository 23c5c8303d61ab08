"""LangChain's ways of forcing a tool call run unchanged against ``pydflash serve``
(issue #64): ``bind_tools(tool_choice="required")`` sends ``"required"``,
``with_structured_output(method="function_calling")`` a named function. The real
``langchain-openai`` package (skipped where it is not installed) against a real server
on 127.0.0.1, on the phrase model (support.phrases): the likeliest reply ends at once,
the call comes second, so only a forced call is a call."""

from __future__ import annotations

import pytest

from pydflash import Llama
from pydflash.server import Server

langchain_openai = pytest.importorskip("langchain_openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
ASK = "Weather in Paris?"


@pytest.fixture(scope="module")
def chat(phrase_files):
    t, d, ids = phrase_files
    with Llama(t, draft=d, n_ctx=2048, n_threads=1) as llm:
        srv = Server(llm, port=0).start()
        try:
            # OpenAI's logit_bias range is [-100, 100]: ending now first, the call second
            yield langchain_openai.ChatOpenAI(
                base_url=srv.url + "/v1", api_key="none", model="phrases", temperature=0, max_tokens=8,
                max_retries=0, timeout=120, logit_bias={llm.token_eos(): 100, ids["call"]: 98},
            )  # fmt: skip
        finally:
            srv.shutdown()


def test_bind_tools_with_tool_choice_required(chat):
    free = chat.bind_tools([WEATHER]).invoke(ASK)
    assert free.tool_calls == []  # "auto": the model may end without a call, and does
    forced = chat.bind_tools([WEATHER], tool_choice="required").invoke(ASK)
    (call,) = forced.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    assert forced.response_metadata["finish_reason"] == "tool_calls"


def test_with_structured_output_by_function_calling(chat):
    schema = {"title": "get_weather", "description": "Current weather of a city", "type": "object",
              "properties": {"city": {"type": "string"}}, "required": ["city"]}  # fmt: skip
    structured = chat.with_structured_output(schema, method="function_calling")
    assert structured.invoke(ASK) == {"city": "Paris"}
    raw = chat.with_structured_output(schema, method="function_calling", include_raw=True).invoke(ASK)
    assert raw["parsing_error"] is None and raw["raw"].tool_calls[0]["name"] == "get_weather"
