"""Stacked n-gram drafting (llama.cpp's --spec-type list): n-gram drafts from a
sequence's own history are tried first, the DFlash block otherwise; the output
stays the target's own at temperature 0, on every target kind, alone and in
batches, and each source's drafted/accepted counts are reported."""

from __future__ import annotations

import dataclasses
import json
import json.decoder
from pathlib import Path

import pytest

import pydflash
from pydflash import Llama, NgramConfig, gguf_writers
from support.models import HYBRID_DRAFTERS, HYBRID_TARGETS, TARGET
from support.ngram import SMALL

# code the embedded pair's target partly re-emits from its context
_SRC = Path(json.decoder.__file__).read_text(encoding="utf-8")
COPY_PROMPT = _SRC[:1500] + "\n\n" + _SRC[:600]  # pair v2 re-emits the repeated start from here on
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def sources(res) -> dict[str, tuple[int, int]]:
    return {k: (v.n_drafted, v.n_accepted) for k, v in res.stats.by_source.items()}


@pytest.fixture(scope="module")
def copy_reference(embedded_target):
    return embedded_target.generate(COPY_PROMPT, max_tokens=200).tokens


STACKS = [
    ["ngram-mod", "draft-dflash"],
    ["draft-dflash", "ngram-simple"],  # the order given does not matter: n-gram first
    ["ngram-map-k", "ngram-mod", "draft-dflash"],
    ["ngram-map-k4v", "ngram-cache", "draft-dflash"],
]


@pytest.mark.parametrize("stack", STACKS, ids=",".join)
def test_stacks_on_the_embedded_pair_are_lossless(stack, copy_reference):
    target, drafter = pydflash.embedded_pair()
    with Llama(target, draft=drafter, speculative=stack, n_ctx=1024) as llm:
        # pinned: the adaptive length may stop drafting on this compute-bound target
        res = llm.generate(COPY_PROMPT, max_tokens=200, draft_max=7)
    assert res.tokens == copy_reference
    by = sources(res)
    assert sum(d for d, _ in by.values()) == res.stats.n_drafted
    assert sum(a for _, a in by.values()) == res.stats.n_accepted
    assert set(by) <= set(stack)
    if stack[0] != "ngram-map-k4v":  # these sources find the copied code on this prompt
        ngram = [k for k in by if k.startswith("ngram-")]
        assert ngram and all(by[k][1] > 0 for k in ngram), by
        assert by["draft-dflash"][0] > 0


def test_the_ngram_source_comes_first_whatever_the_order(embedded_target):
    target, drafter = pydflash.embedded_pair()
    runs = []
    for stack in (["ngram-mod", "draft-dflash"], ["draft-dflash", "ngram-mod"]):
        with Llama(target, draft=drafter, speculative=stack, n_ctx=1024) as llm:
            res = llm.generate(COPY_PROMPT, max_tokens=120, draft_max=7)  # pinned: adaptive lengths follow timings
            runs.append([(s.source, s.n_drafted, s.n_accepted) for s in res.stats.steps])
    assert runs[0] == runs[1]
    # the drafter drafts at every step it is asked: an n-gram draft taken means it came first
    assert any(source == "ngram-mod" for source, _, _ in runs[0])


def test_ngram_alone_on_the_target(copy_reference):
    target, _ = pydflash.embedded_pair()
    with Llama(target, speculative="ngram-mod", n_ctx=1024) as llm:
        res = llm.generate(COPY_PROMPT, max_tokens=200)
    assert res.tokens == copy_reference
    by = sources(res)
    assert set(by) == {"ngram-mod"} and by["ngram-mod"][1] > 0
    assert res.stats.n_steps < 200  # the accepted n-gram tokens saved target passes


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("ngram")
    t, dr = gguf_writers.write_pair(d, TARGET)
    hybrids = {}
    for arch in ("qwen35", "qwen3next"):
        spec = HYBRID_TARGETS[arch]
        dspec = HYBRID_DRAFTERS["b8"]
        if arch == "qwen3next":
            dspec = dataclasses.replace(dspec, rope_sections=None)
        hybrids[arch] = gguf_writers.write_hybrid_pair(d / arch, spec, dspec)
    return {"qwen3": (t, dr), **hybrids}


PROMPTS = [[5, 17, 42, 99, 250, 5, 17], [300, 12, 12, 7, 300, 12], list(range(40, 70, 3))]


@pytest.mark.parametrize("arch", ["qwen3", "qwen35", "qwen3next"])
@pytest.mark.parametrize("stack", [["ngram-mod", "draft-dflash"], ["ngram-simple", "ngram-map-k"]],
                         ids=",".join)
def test_stacks_on_random_targets_are_lossless(random_models, arch, stack):
    # long n-gram drafts roll back past the hybrid target's state planes: checkpoints
    target, drafter = random_models[arch]
    with Llama(target, n_ctx=512) as base:
        refs = [base.generate(p, max_tokens=80, ignore_eos=True).tokens for p in PROMPTS]
    draft = drafter if "draft-dflash" in stack else None
    with Llama(target, draft=draft, speculative=stack, ngram=SMALL, n_ctx=512) as llm:
        outs = [llm.generate(p, max_tokens=80, ignore_eos=True) for p in PROMPTS]
        # several sequences in shared passes give the same
        with Llama(target, draft=draft, speculative=stack, ngram=SMALL, n_ctx=1536, n_parallel=3) as multi:
            batch = multi.generate_batch(PROMPTS, max_tokens=80, ignore_eos=True)
    for ref, out, b in zip(refs, outs, batch, strict=True):
        assert out.tokens == ref
        assert b.tokens == ref
    drafted = [d for o in outs for k, (d, _) in sources(o).items() if k.startswith("ngram-")]
    assert sum(drafted) > 0, "no n-gram source drafted: the test would prove nothing"
    if arch != "qwen3":
        assert max(s.n_drafted for o in outs for s in o.stats.steps) > 7  # past n_rs_seq


def test_ngram_drafts_stay_within_the_budget(random_models):
    target, _ = random_models["qwen3"]
    with Llama(target, speculative=["ngram-mod"], ngram=SMALL, n_ctx=512) as llm:
        for max_tokens in (1, 2, 9, 33):
            res = llm.generate(PROMPTS[1], max_tokens=max_tokens, ignore_eos=True)
            assert len(res.tokens) == max_tokens
            made = 0
            for s in res.stats.steps:
                assert s.n_drafted <= max_tokens - made - 1
                made += len(s.tokens)


def test_stream_steps_and_the_step_api_name_their_source(random_models):
    target, drafter = random_models["qwen3"]
    with Llama(target, draft=drafter, speculative=["ngram-mod", "draft-dflash"], ngram=SMALL, n_ctx=512) as llm:
        # the drafter's block pinned: the adaptive length may stop the random drafter
        steps = list(llm.stream(PROMPTS[1], max_tokens=60, ignore_eos=True, draft_max=llm.pair.max_draft))
        assert {s.source for s in steps if s.n_drafted} == {"ngram-mod", "draft-dflash"}
        pair = llm.pair
        pair.prefill(PROMPTS[0])
        assert pair.step(draft=[1, 2]).source == "external"
        assert pair.step(0).source == ""


BAD = [
    (["ngram-bogus"], "speculative type 'ngram-bogus' is unknown"),
    (["ngram-mod", "ngram-mod"], "listed twice"),
    (["none", "ngram-mod"], "'none' cannot be combined"),
    (["draft-simple"], "'draft-simple' is not supported"),
    (["draft-eagle3", "ngram-mod"], "'draft-eagle3' is not supported"),
]


@pytest.mark.parametrize(("spec", "message"), BAD)
def test_bad_lists_are_refused_before_loading(target_path, spec, message):
    with pytest.raises(ValueError, match=message):
        Llama(target_path, speculative=spec)


def test_the_list_must_match_the_drafter(target_path, model_dir):
    with pytest.raises(ValueError, match="no drafter is loaded: pass draft="):
        Llama(target_path, speculative=["ngram-mod", "draft-dflash"])
    with pytest.raises(ValueError, match="does not list 'draft-dflash'"):
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", speculative=["ngram-mod"])
    with pytest.raises(TypeError, match="speculative entries must be str"):
        Llama(target_path, speculative=["ngram-mod", 3])  # type: ignore[list-item]
    # a comma-separated string, as llama.cpp's --spec-type takes it
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", speculative="ngram-mod,draft-dflash") as llm:
        assert llm.config.speculative == ("ngram-mod", "draft-dflash")
        assert len(llm.generate([1, 2, 3], max_tokens=4, ignore_eos=True).tokens) == 4


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mod_n_match", 0, r"ngram mod_n_match must be in \[1, 1024\]"),
    ("mod_n_min", 70, "mod_n_min 70 exceeds mod_n_max 64"),
    ("simple_size_m", 5000, r"simple_size_m must be in \[1, 1024\]"),
    ("map_k_min_hits", 0, "map_k_min_hits"),
])
def test_bad_ngram_settings(field, value, message):
    with pytest.raises(ValueError, match=message):
        NgramConfig(**{field: value})
    with pytest.raises(TypeError, match="must be an int"):
        NgramConfig(**{field: 1.5})


def test_ngram_defaults_are_llama_cpps():
    # common_params_speculative's defaults (common/common.h), read by the core
    c = NgramConfig()
    assert (c.mod_n_match, c.mod_n_min, c.mod_n_max) == (24, 48, 64)
    assert (c.simple_size_n, c.simple_size_m) == (12, 48)


NATIVE_STACKS = [
    ("ngram-mod,draft-dflash", True),
    ("ngram-simple,draft-dflash", True),
    ("ngram-map-k,ngram-mod,draft-dflash", True),
    ("ngram-mod", False),
    ("draft-dflash", True),
]


@pytest.mark.parametrize(("stack", "with_drafter"), NATIVE_STACKS, ids=[s for s, _ in NATIVE_STACKS])
def test_steps_equal_llama_cpps_own_loop(stack, with_drafter):
    # the same files, prompt and settings: every step drafts and accepts what
    # llama.cpp's loop does (which source drafted shows in the draft lengths:
    # n-gram drafts run to 64 tokens, DFlash blocks to 7)
    from support.native_loop import matches_native, native_steps

    target, drafter = pydflash.embedded_pair()
    draft = drafter if with_drafter else None
    native = native_steps(target, COPY_PROMPT, 200, stack, draft=draft)
    with Llama(target, draft=draft, speculative=stack, n_ctx=2048) as llm:
        res = llm.generate(COPY_PROMPT, max_tokens=200, draft_max=7 if with_drafter else None)
    ours = [(s.n_accepted, s.n_drafted) for s in res.stats.steps]
    matches_native(ours, native)
    if "ngram" in stack:
        assert any(d > 7 for _, d in ours)  # n-gram drafts are among them


def test_the_server_takes_spec_type_and_reports_each_source(embedded_target, copy_reference):
    import urllib.request

    from support.http import metrics, serve

    target, drafter = pydflash.embedded_pair()
    with serve("-m", str(target), "-d", str(drafter), "--n-ctx", "1024", "--spec-type", "ngram-mod,draft-dflash",
               "--spec-ngram-mod-n-min", "16", "--draft-max", "7") as url:  # pinned: the adaptive length may stop
        body = json.dumps({"prompt": COPY_PROMPT, "max_tokens": 200, "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())
        m = metrics(url)
    assert out["choices"][0]["text"] == embedded_target.detokenize(copy_reference).decode()
    sources = out["speculative"]["draft_sources"]
    assert set(sources) == {"ngram-mod", "draft-dflash"}
    assert sum(s["draft_n"] for s in sources.values()) == out["timings"]["draft_n"]
    for name, s in sources.items():
        assert m[f'pydflash_draft_tokens_by_source_total{{source="{name}"}}'] == s["draft_n"]
        assert m[f'pydflash_draft_tokens_accepted_by_source_total{{source="{name}"}}'] == s["draft_n_accepted"]
