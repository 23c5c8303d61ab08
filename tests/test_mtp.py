"""MTP drafting (speculative type 'draft-mtp'): the target's own next-token-prediction
head drafts, through llama.cpp's implementation. Tiny qwen35 targets with a head
(pydflash.gguf_writers.mtp) whose head copies the target's hidden state, so drafts are
accepted often enough to exercise partial acceptance."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pydflash import DraftCompatibilityError, Grammar, Llama, ModelLoadError, NgramConfig, _core, gguf_writers
from pydflash.gguf_writers.mtp import write_mtp_target
from support.costs import compute_bound, pin_costs
from support.mtp import HEAD, SPEC

PROMPTS = ["def main(argv=None):\n    parser", "The target model verifies every", "import os, sys; print("]
N = 48
T1 = 1  # n_threads: these models are tiny, and a second thread only waits on a busy machine


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mtp")
    write_mtp_target(d / "qwen35.gguf", SPEC, HEAD)
    write_mtp_target(d / "qwen35moe.gguf", dataclasses.replace(SPEC, architecture="qwen35moe", seed=9), HEAD)
    gguf_writers.write_hybrid_target(d / "qwen35-plain.gguf", SPEC)  # the same trunk, no head
    return d


@pytest.fixture(scope="module")
def references(models: Path) -> dict[tuple[str, str], list[int]]:
    out = {}
    for arch in ("qwen35", "qwen35moe"):
        with Llama(models / f"{arch}.gguf", n_ctx=512, n_threads=T1) as llm:  # the target alone
            for p in PROMPTS:
                out[arch, p] = llm.generate(p, max_tokens=N, ignore_eos=True).tokens
    return out


def test_the_head_leaves_the_trunk_alone(models, references):
    # the writer's trunk is write_hybrid_target's: with and without a head, one model
    with Llama(models / "qwen35-plain.gguf", n_ctx=512, n_threads=T1) as llm:
        assert llm.generate(PROMPTS[0], max_tokens=N, ignore_eos=True).tokens == references["qwen35", PROMPTS[0]]
    m = _core.Model.load(str(models / "qwen35.gguf"), _core.ModelParams(load_mtp=True), "target")
    assert (m.n_layer_nextn, m.n_layer) == (1, SPEC.n_layer)  # n_layer: the trunk's


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("draft_max", [1, 3, 6])
def test_greedy_is_lossless(models, references, arch, draft_max):
    with Llama(models / f"{arch}.gguf", speculative=["draft-mtp"], draft_max=draft_max, n_ctx=512, n_threads=T1) as llm:
        assert llm.drafter_kind == "mtp"
        accepted = 0
        for p in PROMPTS:
            res = llm.generate(p, max_tokens=N, ignore_eos=True)
            assert res.tokens == references[arch, p]
            assert {s.source for s in res.stats.steps if s.n_drafted} == {"draft-mtp"}
            assert all(s.n_drafted <= draft_max for s in res.stats.steps)
            accepted += res.stats.n_accepted
        assert accepted > 0
        assert res.stats.by_source["draft-mtp"].n_accepted == res.stats.n_accepted


# ngram-mod's drafts stay within the state planes (3): llama.cpp's loop ignores a failed
# seq_rm, so a longer rejected draft would leave its recurrent state wrong
NATIVE_NGRAM = ("--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "3")


@pytest.mark.parametrize("stack", [["draft-mtp"], ["ngram-mod", "draft-mtp"]])
def test_counts_equal_llama_cpp_native(models, stack):
    # the same file, prompt and draft length: every step drafts and accepts what
    # llama-speculative-simple --spec-type ... does (so llama.cpp's own loader takes
    # the written file too). The head starts over with the cache, so one pair serves every
    # prompt; n-gram tables carry over between generations (as in llama-server), so the
    # stack gets a fresh pair per prompt, as each native run is
    from support.native_loop import matches_native, native_steps

    target = models / "qwen35.gguf"
    ngram = NgramConfig(mod_n_match=4, mod_n_min=1, mod_n_max=3)

    def run(prompts: list[str]) -> list:
        with Llama(target, speculative=stack, ngram=ngram, draft_max=3, n_ctx=2048, n_threads=T1) as llm:
            return [llm.generate(p, max_tokens=64, ignore_eos=True) for p in prompts]

    results = run(PROMPTS) if stack == ["draft-mtp"] else [run([p])[0] for p in PROMPTS]
    for p, res in zip(PROMPTS, results, strict=True):
        native = native_steps(target, p, 64, ",".join(stack), draft_max=3, extra=NATIVE_NGRAM)
        ours = [(s.n_accepted, s.n_drafted) for s in res.stats.steps]
        if res.stats.steps[-1].draft_max == 0:  # no token left to draft: llama.cpp's n_max 0 means no limit
            ours = ours[:-1]
        matches_native(ours, native)
        assert sum(a for a, _ in native) > 0
        assert {s.source for s in res.stats.steps if s.n_drafted} == set(stack)


def test_several_sequences_are_lossless(models, references):
    with Llama(
        models / "qwen35.gguf", speculative=["draft-mtp"], draft_max=3, n_ctx=1024, n_parallel=3, n_threads=T1
    ) as llm:
        results = llm.generate_batch(PROMPTS, max_tokens=N, ignore_eos=True)
    assert [r.tokens for r in results] == [references["qwen35", p] for p in PROMPTS]
    assert max(s.n_batch_seqs for r in results for s in r.stats.steps) > 1


def test_checkpoint_rollback_and_ngram_stack_are_lossless(models, references):
    # checkpoint: rejected drafts are undone by restoring and replaying (the head is not fed
    # the replay); the stack: n-gram drafts first, the head otherwise
    ngram = NgramConfig(mod_n_match=4, mod_n_min=1, mod_n_max=8)  # longer than the planes: checkpoints
    for kw in ({"rollback": "checkpoint"}, {"speculative": ["ngram-mod", "draft-mtp"], "ngram": ngram}):
        opts = {"speculative": ["draft-mtp"], **kw}
        with Llama(models / "qwen35.gguf", draft_max=3, n_ctx=512, n_threads=T1, **opts) as llm:  # type: ignore[arg-type]
            for p in PROMPTS:
                res = llm.generate(p, max_tokens=N, ignore_eos=True)
                assert res.tokens == references["qwen35", p]
                assert {s.source for s in res.stats.steps if s.n_drafted} <= {"draft-mtp", "ngram-mod"}


def test_context_end_prompt_cache_stream_and_grammar_are_lossless(models):
    # two sequences of 64 tokens each run into their ends (the head drafts past them);
    # a follow-up prompt extends the cached history; a grammar rejects what it disallows
    path = models / "qwen35.gguf"
    kw = {"n_ctx": 128, "n_parallel": 2, "n_threads": T1}
    with Llama(path, **kw) as base, Llama(path, speculative=["draft-mtp"], draft_max=3, **kw) as llm:
        for p in PROMPTS:
            res = llm.generate(p, max_tokens=200, ignore_eos=True)
            assert res.tokens == base.generate(p, max_tokens=200, ignore_eos=True).tokens
            assert res.finish_reason == "length" and len(res.tokens) < 64
        first = llm.generate(PROMPTS[0], max_tokens=10, ignore_eos=True).tokens
        follow = llm.tokenize(PROMPTS[0]) + first + llm.tokenize(" x")
        assert (
            llm.generate(follow, max_tokens=20, ignore_eos=True).tokens
            == base.generate(follow, max_tokens=20, ignore_eos=True).tokens
        )
        steps = list(llm.stream(PROMPTS[1], max_tokens=30, ignore_eos=True))
        assert [t for st in steps for t in st.tokens] == base.generate(
            PROMPTS[1], max_tokens=30, ignore_eos=True
        ).tokens
        g = Grammar('root ::= ("ma" | " ma" | "x" | " whol")+')
        res = llm.generate(PROMPTS[2], max_tokens=20, grammar=g)
        assert res.tokens == base.generate(PROMPTS[2], max_tokens=20, grammar=g).tokens and res.stats.n_accepted > 0


def test_sampled_drafts_are_verified_as_one_hot(models, references):
    # tokens only (no q): at temperature > 0 a draft is kept with probability p(x); with
    # top_k=1 p is one-hot at the target's choice, so the output is the greedy one
    with Llama(models / "qwen35.gguf", speculative=["draft-mtp"], draft_max=3, n_ctx=512, n_threads=T1) as llm:
        for verify in ("rejection", "match"):
            res = llm.generate(PROMPTS[0], max_tokens=N, ignore_eos=True, temperature=0.8, top_k=1, verify=verify)
            assert res.tokens == references["qwen35", PROMPTS[0]]
            assert res.stats.n_accepted > 0


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_sampled_generations_keep_the_target_distribution(tmp_path, verify):
    # test_block_sampling's check: the first k + 1 tokens of N generations at T = 1
    # against the target alone's exact distributions (the one-hot q is exact)
    import numpy as np

    from support import blocks

    path = write_mtp_target(tmp_path / "peaked.gguf", blocks.QWEN35, HEAD)
    kw = {"n_ctx": 256, "n_threads": T1}
    with Llama(path, speculative=["draft-mtp"], draft_max=3, **kw) as llm, Llama(path, **kw) as base:
        seqs, reach = blocks.sample_blocks(llm, blocks.N, 3, blocks.PLAIN, verify)
        pvals = blocks.target_pvalues(base, seqs, blocks.PLAIN)
    assert blocks.passes(pvals), np.round(pvals, 6).tolist()
    assert reach[3] > 0.05 and reach[1] < 0.99, reach  # whole drafts kept, and rejections


def test_a_saved_sequence_continues_losslessly(models, references, tmp_path):
    ref = references["qwen35", PROMPTS[1]]
    with Llama(models / "qwen35.gguf", speculative=["draft-mtp"], draft_max=3, n_ctx=512, n_threads=T1) as llm:
        pair = llm.pair
        pair.prefill(llm.tokenize(PROMPTS[1]))
        got: list[int] = []
        while len(got) < 12:
            got += pair.step().tokens
        llm.save_slot(0, tmp_path / "slot.bin")
        pair.reset()
        llm.load_slot(0, tmp_path / "slot.bin")
        while len(got) < N:
            got += pair.step().tokens
    assert got[:N] == ref


def test_targets_without_a_head_are_refused(models, target_path):
    for path in (target_path, models / "qwen35-plain.gguf"):
        with pytest.raises(DraftCompatibilityError, match="no next-token-prediction layers"):
            Llama(path, speculative=["draft-mtp"], n_ctx=256, n_threads=T1)


def test_files_llama_cpp_would_abort_on_are_refused(models, tmp_path):
    two = write_mtp_target(tmp_path / "two.gguf", SPEC, dataclasses.replace(HEAD, layers=2))
    with pytest.raises(DraftCompatibilityError, match="runs exactly one"):
        Llama(two, speculative=["draft-mtp"], n_ctx=256, n_threads=T1)
    broken = write_mtp_target(tmp_path / "broken.gguf", SPEC, dataclasses.replace(HEAD, omit=("nextn.eh_proj",)))
    with pytest.raises(ModelLoadError):
        Llama(broken, speculative=["draft-mtp"], n_ctx=256, n_threads=T1)
    # loaded without the head's weights: its graph would assert
    m = _core.Model.load(str(models / "qwen35.gguf"), _core.ModelParams(), "target")
    with pytest.raises(ValueError, match=r"load_mtp=True"):
        _core.ContextPair(m, None, _core.PairParams(n_ctx=256, speculative=["draft-mtp"]))


def test_bad_values_say_what_to_do(models, model_dir):
    path = models / "qwen35.gguf"
    with pytest.raises(ValueError, match="load the target alone for MTP"):
        Llama(path, draft=model_dir / "drafter-b8.gguf", speculative=["draft-mtp"], n_ctx=256, n_threads=T1)
    with Llama(path, speculative=["draft-mtp"], draft_max=3, n_ctx=256, n_threads=T1) as llm:
        with pytest.raises(ValueError, match="create it with a larger draft_max"):
            llm.generate(PROMPTS[0], max_tokens=4, draft_max=5)
        with pytest.raises(ValueError, match="use draft_p_min=0"):
            llm.generate(PROMPTS[0], max_tokens=4, draft_p_min=0.5)
        assert llm.generate(PROMPTS[0], max_tokens=4).tokens  # still usable


def test_the_cli_drafts_with_the_head_and_info_counts_its_layers(models):
    from support.cli import run

    path = str(models / "qwen35.gguf")
    proc = run("generate", "-m", path, "-p", PROMPTS[0], "-n", "24", "--spec-type", "draft-mtp", "--draft-max", "3",
               "--threads", "1", "--temperature", "0")  # fmt: skip
    assert "draft-mtp=" in proc.stderr  # the stats line
    info = json.loads(run("info", "-m", path, "--json").stdout)
    assert info["target"]["mtp_layers"] == 1


def test_the_server_reports_mtp_drafts_as_their_own_source(models):
    import urllib.request

    from support.http import metrics, serve

    with serve("-m", str(models / "qwen35.gguf"), "--n-ctx", "512", "--spec-type", "draft-mtp", "--draft-max", "3",
               "--threads", "1") as url:  # fmt: skip
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": N, "temperature": 0, "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.loads(r.read())
        m = metrics(url)
    assert out["usage"]["completion_tokens"] == N
    source = out["speculative"]["draft_sources"]["draft-mtp"]
    assert source["draft_n"] == out["timings"]["draft_n"] > 0
    assert m['pydflash_draft_tokens_by_source_total{source="draft-mtp"}'] == source["draft_n"]
    assert m['pydflash_draft_tokens_accepted_by_source_total{source="draft-mtp"}'] == source["draft_n_accepted"]


def test_the_adaptive_length_chooses_mtp_drafts_losslessly(models, references, monkeypatch):
    # draft_max None: the head's length is llama.cpp's default (3) and each step
    # drafts 0 (plain decoding) to 3 of it, chosen as for a drafter. The costs are pinned
    # (a target pass costs its rows, as where compute-bound; no online correction): a
    # measured calibration on a busy machine may make rows look free and drafting always pay
    pin_costs(monkeypatch, compute_bound)
    with Llama(models / "qwen35.gguf", speculative=["draft-mtp"], n_ctx=512, n_threads=T1) as llm:
        assert llm.pair.max_draft == 3 and llm.pair.draft_pass_rows == 0  # the head's cost follows k
        lengths = []
        for p in PROMPTS:
            res = llm.generate(p, max_tokens=N, ignore_eos=True)
            assert res.tokens == references["qwen35", p]
            lengths += res.stats.draft_lengths[:-1]  # the last step has no token left to draft
            assert all(s.n_drafted <= s.draft_max <= 3 for s in res.stats.steps)
        assert 0 in lengths  # chosen: a fixed length drafts 3 every step (the random head is mostly rejected)
