"""``POST /infill`` on a model with FIM tokens: the prompt is llama-server's
(vendor/llama.cpp/tools/server/server-common.cpp, ``format_prompt_infill``, with
``spm_infill`` off): the extra chunks first ([FIM_REP]"myproject\\n", then per chunk
[FIM_SEP]filename"\\n" and its text, or without FIM_SEP a "--- snippet ---"
separator; then [FIM_SEP]"filename\\n"), BOS where the vocabulary adds one,
[FIM_PRE] prefix ``prompt`` [FIM_SUF] suffix [FIM_MID]; the prefix keeps its last
3/4 of a batch, the suffix its first batch/4 - 2 - len(prompt) tokens, the extra
its last n_ctx - n_batch - 2 * n_predict (``-n``) tokens. Tiny pairs whose
vocabulary has the FIM tokens (tokenizer.ggml.fim_*_token_id)."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pydflash import Llama, gguf_writers
from pydflash.server import Server
from pydflash.server.native import InfillRequest, fim_tokens
from support.models import DRAFTERS, TARGET

N_CTX, N_BATCH = 512, 64
GREEDY = {"temperature": 0, "ignore_eos": True}
ALL = ("pre", "suf", "mid", "pad", "rep", "sep")


def write_fim_pair(d: Path, parts: tuple[str, ...]) -> tuple[Path, Path]:
    spec = dataclasses.replace(TARGET, fim=parts)
    return gguf_writers.write_target(d / "t.gguf", spec), gguf_writers.write_drafter(d / "d.gguf", spec, DRAFTERS["b8"])


@pytest.fixture(scope="module")
def fim(tmp_path_factory: pytest.TempPathFactory):
    target, drafter = write_fim_pair(tmp_path_factory.mktemp("fim"), ALL)
    with Llama(target, draft=drafter, n_ctx=N_CTX, n_batch=N_BATCH) as llm:
        yield llm


@pytest.fixture(scope="module")
def fim_no_sep(tmp_path_factory: pytest.TempPathFactory):
    target, drafter = write_fim_pair(tmp_path_factory.mktemp("fim3"), ("pre", "suf", "mid"))
    with Llama(target, draft=drafter, n_ctx=N_CTX, n_batch=N_BATCH) as llm:
        yield llm


@pytest.fixture(scope="module")
def server(fim: Llama):
    srv = Server(fim, port=0).start()
    yield srv
    srv.shutdown()


def llama_server_rule(llm: Llama, body: dict, n_predict: int = -1) -> list[int]:
    """format_prompt_infill, line by line (spm_infill false)."""
    ids = fim_tokens(llm)

    def tok(text: str) -> list[int]:
        return list(llm.core_model.tokenize(text, False, False))

    extra: list[int] = []
    if "rep" in ids:
        extra += [ids["rep"], *tok("myproject\n")]
    for chunk in body.get("input_extra", []):
        if "sep" in ids:
            extra += [ids["sep"], *tok(chunk.get("filename", "tmp") + "\n")]
        else:
            extra += tok("\n\n--- snippet ---\n\n")
        extra += tok(chunk["text"])
    if "sep" in ids:
        extra += [ids["sep"], *tok("filename\n")]
    prefix, suffix = tok(body["input_prefix"]), tok(body["input_suffix"])
    prompt = list(llm.core_model.tokenize(body.get("prompt", ""), False, True))
    n_prefix = min(len(prefix), 3 * (N_BATCH // 4))
    n_suffix = min(len(suffix), max(0, N_BATCH // 4 - (2 + len(prompt))))
    n_extra = min(max(0, N_CTX - N_BATCH - 2 * n_predict), len(extra))
    inp = [ids["pre"], *prefix[len(prefix) - n_prefix :], *prompt]
    if llm.core_model.add_bos:
        inp = [llm.core_model.bos, *inp]
    return extra[len(extra) - n_extra :] + inp + [ids["suf"], *suffix[:n_suffix], ids["mid"]]


BODY = {
    "input_prefix": "def add(a, b):\n    ",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"filename": "util.py", "text": "import os\n"}, {"text": "x = 1\n"}],
    "prompt": "return",
}


def call(srv: Server, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + "/infill", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_model_has_its_fim_tokens(fim):
    ids = fim_tokens(fim)
    assert set(ids) == set(ALL) - {"pad"}  # the ones the infill prompt uses
    for part in ids:
        text = gguf_writers.FIM_TOKENS[part]
        assert bytes(fim.core_model.token_to_piece(ids[part], True)).decode() == text


def test_the_prompt_is_llama_servers(fim):
    ids = fim_tokens(fim)
    got = InfillRequest.model_validate(BODY).infill_tokens(fim)
    assert got == llama_server_rule(fim, BODY)
    # the order of the FIM tokens as the source states it
    marks = [t for t in got if t in (ids["rep"], ids["sep"], ids["pre"], ids["suf"], ids["mid"])]
    assert marks == [ids["rep"], ids["sep"], ids["sep"], ids["sep"], ids["pre"], ids["suf"], ids["mid"]]
    assert got[: 1 + len(fim.core_model.tokenize("myproject\n", False, False))][0] == ids["rep"]
    assert got[-1] == ids["mid"]


def test_long_inputs_are_cut_as_llama_server_cuts_them(fim):
    body = {
        "input_prefix": "def f(x):\n" * 40,
        "input_suffix": "return x\n" * 40,
        "input_extra": [{"filename": f"m{i}.py", "text": "import os, sys\n" * 30} for i in range(4)],
        "prompt": "    y",
    }
    req = InfillRequest.model_validate(body)
    req.fill({"max_tokens": 16})  # serve -n 16: the extra keeps n_ctx - n_batch - 32 tokens
    got = req.infill_tokens(fim)
    assert got == llama_server_rule(fim, body, n_predict=16)
    assert len(got) < len(InfillRequest.model_validate(body).infill_tokens(fim))


def test_without_fim_sep_the_chunks_get_the_snippet_separator(fim_no_sep):
    got = InfillRequest.model_validate(BODY).infill_tokens(fim_no_sep)
    assert got == llama_server_rule(fim_no_sep, BODY)
    assert fim_no_sep.detokenize(got).decode().count("--- snippet ---") == 2


def test_infill_completes(server, fim):
    want = fim.generate(llama_server_rule(fim, BODY), max_tokens=6, **GREEDY)
    status, res = call(server, {**BODY, "n_predict": 6, "return_tokens": True, **GREEDY})
    assert status == 200, res
    assert res["tokens"] == want.tokens and res["content"] == want.text
    assert res["tokens_evaluated"] == len(llama_server_rule(fim, BODY)) and res["stop_type"] == "limit"


@pytest.mark.parametrize(
    "body, message",
    [
        ({"input_suffix": ""}, "input_prefix"),
        ({"input_prefix": ""}, "input_suffix"),
        ({**BODY, "prompt": [1, 2]}, "prompt"),
        ({**BODY, "input_extra": [{"filename": "a.py"}]}, '"text" field'),
        ({**BODY, "input_extra": [{"text": "x", "filename": 3}]}, "filename"),
    ],
    ids=["no prefix", "no suffix", "prompt not text", "chunk without text", "filename not text"],
)
def test_bad_requests(server, body, message):
    status, res = call(server, body)
    assert status == 400 and message in res["error"]["message"], res
