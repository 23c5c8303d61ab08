"""Grammar-constrained output under speculation (GBNF and JSON schemas).

* Greedy: DFlash with a grammar gives exactly the target-alone output under the same
  grammar (the embedded pair and tiny models), and the text is in the grammar's language.
* Sampled: position by position the sampler's reported distribution is llama.cpp's
  chain applied to the target's logits with every token the grammar forbids at -inf (the
  mask before top-k/top-p; numpy, on ``score()`` rows). That the tokens follow it, drafted
  or not, in both verification modes, is checked decision by decision in
  tests/test_accept_resample.py (a chi-square check of the first two tokens had no power
  here: 0.001 against a sampler at temperature x1.25, benchmarks/results/sampling-test-power.json).
* JSON-schema output parses and validates on every prompt, greedy and sampled.
* A grammar that does not parse, or a schema that cannot convert, raises a ValueError
  before any work; the model stays usable."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import pydflash
from pydflash import Grammar, GrammarError, Llama
from support.json_schema import PROMPTS, SCHEMA
from support.sampling import GRAMMAR_SETTINGS, PROMPT, letters_allowed, transform

# the tiny test vocabulary: bytes, then merges; [a-e]+ allows 'a'..'e' and 'de'
LETTERS = "root ::= [a-e]+"
PY_DEF = 'root ::= "def " [a-z_]{1,20} "(" [a-z, ]{0,24} "):"'
@pytest.fixture
def embedded(embedded_dflash: Llama, embedded_target: Llama) -> tuple[Llama, Llama]:
    return embedded_dflash, embedded_target


def valid(obj: object) -> bool:
    """SCHEMA, checked by hand (no validator dependency)."""
    if not isinstance(obj, dict) or set(obj) - {"name", "age", "tags"} or not {"name", "age"} <= set(obj):
        return False
    name, age, tags = obj["name"], obj["age"], obj.get("tags", [])
    return (
        isinstance(name, str)
        and len(name) <= 12
        and isinstance(age, int)
        and 0 <= age <= 120
        and isinstance(tags, list)
        and len(tags) <= 3
        and all(isinstance(t, str) and len(t) <= 8 for t in tags)
    )


@pytest.mark.parametrize("prompt", ["# a helper\n", "import os\n\n", "class A:\n    "])
def test_gbnf_greedy_is_the_constrained_target(embedded, prompt):
    llm, base = embedded
    # pinned: the adaptive length follows timings and may draft little in 7 tokens
    a = llm.generate(prompt, max_tokens=48, grammar=PY_DEF, draft_max=llm.pair.max_draft)
    b = base.generate(prompt, max_tokens=48, grammar=PY_DEF)
    assert a.tokens == b.tokens
    assert a.finish_reason == "eos" and re.fullmatch(r"def [a-z_]{1,20}\([a-z, ]{0,24}\):", a.text), a.text
    assert a.stats.n_accepted > 0  # the drafter's blocks follow the grammar too


def py_def_prefix(text: str) -> bool:
    """``text`` can still become a PY_DEF match (a prefix of one, or one)."""
    if len(text) <= 4:
        return "def ".startswith(text)
    m = re.fullmatch(r"def ([a-z_]{0,20})(?:\(([a-z, ]{0,24})(\)?|\):))?", text)
    return m is not None and (m.group(2) is None or len(m.group(1)) >= 1)


@pytest.mark.parametrize("prompt", ["# a helper\n", "import os\n\n", "class A:\n    "])
def test_every_drafted_block_follows_the_grammar(embedded, prompt):
    # the drafter's blocks are masked as the target's tokens are: each one continues the
    # accepted text within the grammar (unmasked drafts are merely rejected, still lossless)
    llm, _ = embedded
    done: list[int] = []
    n_drafted = 0
    for step in llm.stream(prompt, max_tokens=48, grammar=PY_DEF, draft_max=llm.pair.max_draft):
        if step.drafted:
            n_drafted += len(step.drafted)
            text = llm.detokenize(done + list(step.drafted)).decode("utf-8", "replace")
            assert py_def_prefix(text), (text, step.drafted)
        done += step.tokens
    assert n_drafted > 0 and re.fullmatch(r"def [a-z_]{1,20}\([a-z, ]{0,24}\):", llm.detokenize(done).decode())


@pytest.mark.parametrize("prompt", PROMPTS)
def test_json_schema_greedy_parses_validates_and_is_lossless(embedded, prompt):
    llm, base = embedded
    a = llm.generate(prompt, max_tokens=160, json_schema=SCHEMA)
    b = base.generate(prompt, max_tokens=160, json_schema=SCHEMA)
    assert a.tokens == b.tokens
    assert a.finish_reason == "eos", a.text
    assert valid(json.loads(a.text)), a.text


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_json_schema_sampled_parses_and_validates(embedded, verify):
    llm, _ = embedded
    for seed, prompt in enumerate(PROMPTS * 2):
        r = llm.generate(prompt, max_tokens=160, json_schema=SCHEMA, temperature=0.9, seed=seed, verify=verify)
        assert r.finish_reason == "eos", r.text
        assert valid(json.loads(r.text)), r.text


def test_json_object_and_grammar_objects(embedded):
    llm, base = embedded
    g = Grammar.from_json_schema({})  # any JSON object, as llama-server's {}
    r = llm.generate("settings = ", max_tokens=160, grammar=g)
    assert r.finish_reason == "eos" and isinstance(json.loads(r.text), dict)
    assert r.tokens == base.generate("settings = ", max_tokens=160, grammar=g).tokens
    # a grammar from a JSON text schema equals the one from the mapping
    assert Grammar.from_json_schema(json.dumps(SCHEMA)) == Grammar.from_json_schema(SCHEMA)


# -- the exact constrained distribution (tiny spread models) ----------------------------


@pytest.fixture(scope="module")
def spread(spread_pair):
    return spread_pair


def test_the_reported_distribution_is_the_masked_chain(spread):
    """Position by position, the sampler's distribution (post-sampling logprobs) is
    llama.cpp's chain on the grammar-masked row: the mask comes before the cuts."""
    llm, base = spread
    kw = GRAMMAR_SETTINGS["T0.7-topk3-topp0.9"]
    r = llm.generate(
        PROMPT,
        max_tokens=2,
        seed=1,
        ignore_eos=True,
        grammar=Grammar(LETTERS),
        logprobs=True,
        top_logprobs=base.n_vocab(),
        post_sampling_probs=True,
        **kw,
    )
    assert r.logprobs is not None
    ctx = list(PROMPT)
    for first, lp in zip((True, False), r.logprobs):
        row = base.pair.score(ctx)[-1].astype(np.float64)
        ref = transform(np.where(letters_allowed(base, first), row, -np.inf), ctx[-64:], **kw)
        got = np.zeros(base.n_vocab())
        for t, v in lp.top:
            got[t] = np.exp(v)
        assert np.abs(got - ref).max() < 1e-4
        ctx.append(lp.token)


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grammar, match",
    [
        ('root ::= "a" foo', "undefined rule 'foo'"),
        ("root ::= [a-", "does not parse"),
        ('start ::= "a"', "no 'root' rule"),
        ("", "empty"),
    ],
)
def test_bad_grammars_raise_before_any_work(embedded, grammar, match):
    llm, _ = embedded
    with pytest.raises(ValueError, match=match):
        llm.generate("x", max_tokens=4, grammar=grammar)
    assert llm.generate("x = ", max_tokens=4, ignore_eos=True).stats.n_tokens == 4


def test_bad_schemas_and_option_mixes(embedded):
    llm, _ = embedded
    with pytest.raises(ValueError, match="not valid JSON"):
        llm.generate("x", max_tokens=4, json_schema="{nope")
    with pytest.raises(ValueError, match="grammar or json_schema, not both"):
        llm.generate("x", max_tokens=4, grammar=LETTERS, json_schema=SCHEMA)
    with pytest.raises(TypeError, match="grammar must be"):
        llm.generate("x", max_tokens=4, grammar=5)  # type: ignore[arg-type]
    assert issubclass(GrammarError, ValueError)


def test_the_step_api_restarts_the_grammar_at_each_prefill_and_set_sampling_drops_it(embedded):
    llm, base = embedded
    prompt = llm.prompt_tokens("x = ")
    pair = llm.pair
    pair.set_sampling()
    pair.set_grammar(Grammar('root ::= [0-9]{1,3} ";"'))
    runs = []
    for _ in range(2):  # the second prefill starts the grammar over
        pair.prefill(prompt)
        toks: list[int] = []
        while not toks or not llm.core_model.is_eog(toks[-1]):
            toks += pair.step().tokens
        runs.append(toks)
    assert runs[0] == runs[1]
    text = llm.detokenize(runs[0][:-1]).decode()
    assert re.fullmatch(r"[0-9]{1,3};", text), text
    pair.set_sampling()  # drops the grammar: the same prompt runs free again
    pair.prefill(prompt)
    free = list(pair.step(0).tokens)
    assert free == base.generate(prompt, max_tokens=1).tokens
    assert llm.generate(prompt, max_tokens=8).tokens == base.generate(prompt, max_tokens=8).tokens


def test_a_grammar_used_again_reuses_its_cache_and_gives_the_same_output(embedded):
    """The pair keeps the allowed-token caches of its last few grammars (by GBNF
    text); warm and cold (a new object) outputs are identical, greedy and sampled,
    with another grammar used in between."""
    llm, _ = embedded
    target, drafter = pydflash.embedded_pair()
    kws = [dict(max_tokens=120), dict(max_tokens=120, temperature=0.8, seed=5)]
    warm = []
    for kw in kws:
        for prompt in PROMPTS[:2]:
            llm.generate(prompt, json_schema=SCHEMA, **kw)  # warms the cache
            llm.generate(prompt, max_tokens=8, grammar=PY_DEF)  # another grammar in between
            warm.append(llm.generate(prompt, json_schema=SCHEMA, **kw).tokens)
    with Llama(target, draft=drafter, n_ctx=1024) as fresh:
        cold = [fresh.generate(p, json_schema=SCHEMA, **kw).tokens for kw in kws for p in PROMPTS[:2]]
    assert warm == cold
