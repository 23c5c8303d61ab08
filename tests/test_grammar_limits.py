"""Grammars and JSON schemas a client can send are bounded before llama.cpp reads them
(csrc/grammar_limits.cpp): whatever the input, the process is not killed (llama.cpp's
parser, left-recursion check and schema converter recurse per nesting level) nor frozen
(repetitions multiply; a maximum below the minimum makes llama.cpp's parser loop until
memory runs out; many optional items in a row keep hundreds of parse stacks alive).
Each refusal is a ValueError that names its limit, and the model stays usable. A mask
over the vocabulary stops when the pair is interrupted, as a decode does."""

from __future__ import annotations

import json

import pytest

from pydflash import GenerationInterrupted, Grammar, GrammarError, Llama, _core

LIMITS = _core.GRAMMAR_LIMITS
LETTERS = 'root ::= [a-e]+'


@pytest.fixture(scope="module")
def llm(target_path):
    with Llama(target_path, n_ctx=256, n_threads=1) as llm:
        yield llm


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def usable(llm: Llama) -> None:
    """The model still generates under a grammar, as before."""
    r = llm.generate("x", max_tokens=3, grammar=LETTERS)
    assert len(r.tokens) == 3 and set(r.text) <= set("abcde")


@pytest.mark.parametrize("depth", [LIMITS["depth"] + 1, 20000, 50000])
def test_deeply_nested_groups_are_refused_before_the_parser(llm, depth):
    # the probe's request: depth 20,000 killed the process in llama.cpp's recursive parser
    with pytest.raises(ValueError, match="grammar depth limit"):
        llm.generate("x", max_tokens=1, grammar=nested(depth))
    with pytest.raises(ValueError, match="grammar depth limit"):
        Grammar(nested(depth))
    usable(llm)


def test_nesting_at_the_limit_still_parses(llm):
    assert llm.generate("x", max_tokens=1, grammar=nested(LIMITS["depth"])).text == "a"


def test_a_long_chain_of_rules_is_refused(llm):
    # llama.cpp's left-recursion check recurses once per chained rule: 70,000 overflowed the
    # stack, and a megabyte of short names holds more
    n = LIMITS["rules"] + 10
    chain = "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "a"\n'
    with pytest.raises(ValueError, match="grammar rule limit"):
        llm.generate("x", max_tokens=1, grammar=chain)
    usable(llm)


@pytest.mark.timeout(120)
def test_the_repetition_bomb_is_refused(llm):
    # the probe's 12 KB grammar: 1000 x 1999 rules froze the engine for 20 minutes
    bomb = "root ::= " + '"a"{0,1999} ' * 1000
    with pytest.raises(ValueError, match="grammar rule limit"):
        llm.generate("x", max_tokens=1, grammar=bomb)
    usable(llm)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "kw",
    [
        {"grammar": 'root ::= "a"{5,2}'},
        {"json_schema": {"type": "string", "minLength": 5, "maxLength": 2}},
        {"json_schema": {"type": "array", "minItems": 5, "maxItems": 2}},
    ],
)
def test_a_maximum_below_the_minimum_is_refused(llm, kw):
    # llama.cpp's parser generated rules for {5,2} until memory ran out
    with pytest.raises(ValueError, match="maximum below its minimum"):
        llm.generate("x", max_tokens=1, **kw)
    usable(llm)


@pytest.mark.timeout(120)
def test_too_many_alternatives_at_once_are_refused(llm):
    # each optional item keeps a parse stack alive: 1,000 took minutes per token
    many = "root ::= " + '"a"? ' * 1000 + '"b"'
    with pytest.raises(ValueError, match="grammar stack limit"):
        llm.generate("x", max_tokens=2, grammar=many)
    usable(llm)


def test_an_ambiguity_that_grows_while_generating_ends_the_generation(llm):
    # one stack at the start; after "x", each of the optional items is one
    grows = 'root ::= "x" ("a"? ){' + str(LIMITS["stacks"] + 8) + '} "b"'
    with pytest.raises(GrammarError, match="grammar stack limit"):
        llm.generate("", max_tokens=2, grammar=grows)
    usable(llm)


def deep_schema(depth: int) -> str:
    return '{"type":"array","items":' * depth + "{}" + "}" * depth


@pytest.mark.parametrize(
    ("schema", "limit"),
    [
        (deep_schema(20000), "JSON depth limit"),
        (deep_schema(LIMITS["json_depth"]), "JSON depth limit"),
        (
            json.dumps(
                {
                    "$defs": {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(20000)}, "d20000": {}},
                    "$ref": "#/$defs/d0",
                }
            ),
            "schema \\$ref limit",
        ),
        (
            json.dumps({"type": "object", "properties": {"a" * 200000: {}}, "additionalProperties": {}}),
            "schema key limit",
        ),
        (json.dumps({"type": "string", "pattern": "^" + "(" * 5000 + "a" + ")" * 5000 + "$"}), "pattern depth limit"),
    ],
)
def test_schemas_the_converter_would_overflow_on_are_refused(llm, schema, limit):
    with pytest.raises(ValueError, match=limit):
        Grammar.from_json_schema(schema)
    with pytest.raises(ValueError, match=limit):
        llm.generate("x", max_tokens=1, json_schema=schema)
    usable(llm)


def test_tools_the_template_would_overflow_on_are_refused(llm):
    deep: dict = {"type": "string"}
    for _ in range(LIMITS["json_depth"] + 5):
        deep = {"type": "array", "items": deep}
    tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
    with pytest.raises(ValueError, match="JSON depth limit"):
        llm.create_chat_completion([{"role": "user", "content": "hi"}], tools=[tool], max_tokens=1)
    usable(llm)


def test_an_interrupted_mask_resets_the_pair_and_the_model_recovers(llm):
    # sampled with no top-k: each row is masked over the whole vocabulary; each run's
    # grammar text its own (a comment), so that no earlier run's mask cache answers for it
    def run(tag: str) -> list[int]:
        kw = dict(max_tokens=4, temperature=1.0, top_k=0, seed=7)
        return llm.generate("x", grammar=f"{LETTERS}  # {tag}", **kw).tokens

    want = run("before")
    # the mask's stop check (the pair's abort check, between chunks of the vocabulary) fires
    llm.pair._core._inject_fault("grammar_mask")
    with pytest.raises(GenerationInterrupted, match="grammar"):
        run("interrupted")
    assert run("after") == want
