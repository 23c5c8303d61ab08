"""DFlash2 (selector lattice), DSpark (Markov + confidence heads) and
reduced-vocabulary (d2t) drafters (issue #15).

For each kind, on a qwen3 and a hybrid (qwen35) target: greedy output equals
the target's own, for one sequence and for several run together (blocks of
different requested lengths in one drafter pass); the kind is reported; files
llama.cpp would abort on are refused with a message naming what is missing;
at temperature > 0 the DFlash2 drafts (tokens only: verified with a one-hot q)
and DSpark drafts (q from the Markov-biased logits) keep the target's
distribution; and on the same files and prompts, driven with the per-step
limits of llama.cpp's own loop (llama-speculative-simple), the drafted and
accepted counts equal that binary's.

The native binary is found in $PYDFLASH_NATIVE_BIN_DIR (default
<repo>/build/native/bin, built by tools/build_native.py); without it those
tests skip, unless PYDFLASH_REQUIRE_NATIVE=1, when they fail.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pydflash import DraftCompatibilityError, Llama, gguf_writers
from pydflash.bench.engines import parse_native_output
from support.native_loop import speculative_simple

V = gguf_writers.DrafterVariant
KINDS = {
    "dflash": V(),
    "dflash2": V("dflash2"),
    "dspark": V("dspark"),
    "dspark-bonus": V("dspark", sample_from_anchor=False, confidence_head=False),
    "d2t": V(d2t_vocab=64),
    "dspark-d2t": V("dspark", d2t_vocab=64),
}
EXPECT = {  # drafter_kind, words of drafter_description
    "dflash": ("dflash", "dflash"),
    "dflash2": ("dflash2", "dflash2 (selector top-k 4)"),
    "dspark": ("dspark", "dspark (anchor-first, confidence head)"),
    "dspark-bonus": ("dspark", "dspark (bonus anchor, no confidence head)"),
    "d2t": ("dflash", "dflash (d2t vocabulary 64)"),
    "dspark-d2t": ("dspark", "dspark (anchor-first, confidence head, d2t vocabulary 64)"),
}
# a target whose next token moves little with the context: random drafters agree
# with it often enough to exercise partial acceptance (about 1 draft in 9 here).
# Its greedy path has near ties past 70 tokens (a batched pass and a single-token
# pass of the target alone disagree there): the long runs use TargetSpec()
QWEN3 = gguf_writers.TargetSpec(head_scale=2.0, hot_tokens=24, seed=5, embd_common=2.0)
HYBRID = gguf_writers.HybridSpec()
PROMPTS = ["def main(argv=None):", "The quick brown fox", [300, 12, 99, 250, 17, 45]]
N_TOKENS = 48


def drafter_spec(target: str, variant: gguf_writers.DrafterVariant) -> gguf_writers.DrafterSpec:
    if target == "qwen3":
        return gguf_writers.DrafterSpec(seed=9, attn_out_scale=2.0, variant=variant)
    return gguf_writers.DrafterSpec(target_layers=(1, 3), rope_sections=HYBRID.rope_sections, variant=variant)


@pytest.fixture(scope="module")
def kind_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    paths = {}
    for target in ("qwen3", "hybrid"):
        for kind, v in KINDS.items():
            sub = d / f"{target}-{kind}"
            if target == "qwen3":
                paths[target, kind] = gguf_writers.write_pair(sub, QWEN3, drafter_spec(target, v))
                # clear margins, context-dependent drafts (mostly rejected): see the counts test
                paths["qwen3-varied", kind] = gguf_writers.write_pair(d / f"varied-{kind}", gguf_writers.TargetSpec(),
                                                                 drafter_spec(target, v))
            else:
                paths[target, kind] = gguf_writers.write_hybrid_pair(sub, HYBRID, drafter_spec(target, v))
    return paths


@pytest.fixture(scope="module")
def references(kind_models):
    cache: dict = {}

    def ref(target: str, prompt) -> list[int]:
        key = (target, repr(prompt))
        if key not in cache:
            with Llama(kind_models[target, "dflash"][0], n_ctx=512, n_threads=1) as base:
                cache[key] = base.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True).tokens
        return cache[key]

    return ref


TARGET_KINDS = [pytest.param(t, k, id=f"{t}-{k}") for t in ("qwen3", "hybrid") for k in KINDS]


@pytest.mark.parametrize("kind", list(KINDS))
def test_kind_is_reported(kind_models, kind):
    t, d = kind_models["qwen3", kind]
    with Llama(t, draft=d, n_ctx=256, n_threads=1) as llm:
        assert llm.drafter_kind == EXPECT[kind][0]
        assert llm.pair.drafter_description == EXPECT[kind][1]
        # anchor-first DSpark drafts a whole block (block_size), the others block_size - 1
        anchor_first = kind in ("dspark", "dspark-d2t")
        assert llm.pair.max_draft == llm.pair.block_size - (0 if anchor_first else 1)
    proc = subprocess.run([sys.executable, "-m", "pydflash", "info", "-m", str(t), "-d", str(d)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"kind          {EXPECT[kind][1]}" in proc.stdout
    assert "drafter fits target: yes" in proc.stdout


def test_no_drafter_has_no_kind(kind_models):
    with Llama(kind_models["qwen3", "dflash"][0], n_ctx=256, n_threads=1) as llm:
        assert llm.drafter_kind == ""


@pytest.mark.parametrize("target,kind", TARGET_KINDS)
def test_greedy_is_lossless(kind_models, references, target, kind):
    t, d = kind_models[target, kind]
    drafted = accepted = 0
    with Llama(t, draft=d, n_ctx=512, n_threads=1) as llm:
        for prompt in PROMPTS:
            for draft_max in (None, 3, 1):
                res = llm.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=draft_max)
                assert res.tokens == references(target, prompt), (prompt, draft_max)
                limit = llm.pair.max_draft if draft_max is None else draft_max
                for s in res.stats.steps:
                    assert 0 <= s.n_accepted <= s.n_drafted <= limit
                drafted += res.stats.n_drafted
                accepted += res.stats.n_accepted
    assert drafted > 0
    if target == "qwen3":  # this target's drafts are partly accepted (see QWEN3)
        assert 0 < accepted < drafted


@pytest.mark.parametrize("target,kind", TARGET_KINDS)
def test_several_sequences_are_lossless(kind_models, references, target, kind):
    # three sequences in shared passes, asking for different draft lengths: the
    # DFlash2 / DSpark graphs need equal blocks in a pass, so the shorter requests
    # are padded to the longest and read partly
    t, d = kind_models[target, kind]
    # (lengths pinned: adaptive ones follow timings, and so would the batches' shapes,
    # which move a random model's near-ties)
    with Llama(t, draft=d, n_ctx=1536, n_parallel=3, n_threads=1) as llm:
        block = llm.pair.max_draft
        subs = [llm.submit(p, max_tokens=N_TOKENS, ignore_eos=True, draft_max=dm)
                for p, dm in zip(PROMPTS, (block, 3, 1), strict=True)]
        results = [s.result() for s in subs]
        assert max(s.n_batch_seqs for r in results for s in r.stats.steps) > 1
        for p, r in zip(PROMPTS, results, strict=True):
            assert r.tokens == references(target, p)
        batch = llm.generate_batch(PROMPTS, max_tokens=N_TOKENS, ignore_eos=True, draft_max=block)
        for p, r in zip(PROMPTS, batch, strict=True):
            assert r.tokens == references(target, p)


@pytest.mark.parametrize("target,kind", [pytest.param(t, k, id=f"{t}-{k}") for t in ("qwen3", "hybrid")
                                         for k in ("dflash2", "dspark")])
def test_sequences_running_into_their_context_end_are_lossless(kind_models, tmp_path, target, kind):
    # three sequences fill their share of one cache (n_ctx 768 = 3 x 256 cells) together:
    # a block padded to the pass's length reaches past its sequence's share there
    t, d = kind_models[target, kind]
    if target == "qwen3":  # clear argmax margins over the whole run (see QWEN3)
        t, d = gguf_writers.write_pair(tmp_path, gguf_writers.TargetSpec(), drafter_spec(target, KINDS[kind]))
    prompts = [PROMPTS[0], "The quick brown fox", PROMPTS[2]]
    with Llama(t, n_ctx=256, n_threads=1) as base:
        refs = [base.generate(p, max_tokens=400, ignore_eos=True) for p in prompts]
    with Llama(t, draft=d, n_ctx=768, n_parallel=3, n_threads=1) as llm:
        assert llm.n_ctx_slot == 256
        subs = [llm.submit(p, max_tokens=400, ignore_eos=True, draft_max=dm)
                for p, dm in zip(prompts, (None, 2, 5), strict=True)]
        outs = [s.result() for s in subs]
    for o, r in zip(outs, refs, strict=True):
        assert o.finish_reason == r.finish_reason == "length"
        assert o.tokens == r.tokens


# the tiny DFlash2 lattice is sharply peaked (its scores add the logits): a high bar
@pytest.mark.parametrize("kind,p_min", [("dflash2", 0.999), ("dspark", 0.6)])
def test_draft_p_min_cuts_blocks_losslessly(kind_models, references, kind, p_min):
    t, d = kind_models["qwen3", kind]
    with Llama(t, draft=d, n_ctx=512, n_threads=1, draft_adaptive=False) as llm:  # counts compared
        full = llm.generate(PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True)
        cut = llm.generate(PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True, draft_p_min=p_min)
    assert cut.tokens == full.tokens == references("qwen3", PROMPTS[0])
    # DFlash2 cuts on the softmax of its lattice scores, DSpark on its confidence head
    assert cut.stats.n_drafted < full.stats.n_drafted


def test_dspark_without_confidence_head_refuses_draft_p_min(kind_models):
    t, d = kind_models["qwen3", "dspark-bonus"]
    with Llama(t, draft=d, n_ctx=256, n_threads=1) as llm:
        with pytest.raises(ValueError, match="no confidence head to cut its block on; use draft_p_min=0"):
            llm.generate("x", max_tokens=4, draft_p_min=0.5)
        assert len(llm.generate("x", max_tokens=4, ignore_eos=True).tokens) == 4


# -- refusals -------------------------------------------------------------------

REFUSED = {
    "dflash2-lattice-too-wide": (V("dflash2", selector_top_k=8), "hidden size 64 is smaller than the selector lattice "
                                 r"row k\(k\+1\) = 72 \(dflash.selector_top_k 8\)"),
    "dflash2-no-conv-group": (V("dflash2", omit_keys=("conv_group_size",)),
                              "DFlash2 drafter: metadata dflash.conv_group_size is missing or not positive"),
    "dflash2-group-not-dividing": (V("dflash2", conv_group=24),
                                   "hidden size 64 is not a multiple of dflash.conv_group_size 24"),
    "d2t-int32": (V(d2t_vocab=64, d2t_dtype="int32"), "d2t has type i32, expected I64 absolute target token ids"),
    "d2t-offsets": (V(d2t_vocab=64, d2t_offsets=True), r"d2t holds id \d+ twice: it looks like offsets"),
    "d2t-no-head": (V(d2t_vocab=64, d2t_head=False), r"needs its own output head output.weight of shape \{64, 64\}"),
    "dspark-no-block-size": (V("dspark", omit_keys=("block_size",)),
                             "DSpark drafter: metadata dflash.block_size is missing"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_files_llama_cpp_would_abort_on_are_refused(kind_models, tmp_path, name):
    variant, message = REFUSED[name]
    t = kind_models["qwen3", "dflash"][0]
    d = gguf_writers.write_drafter(tmp_path / f"{name}.gguf", QWEN3, drafter_spec("qwen3", variant), t)
    with pytest.raises(DraftCompatibilityError, match=message) as info:
        Llama(t, draft=d, n_ctx=256, n_threads=1)
    assert str(d) in str(info.value)
    # the process lives on and a good pair still works
    with Llama(kind_models["qwen3", "dflash2"][0], draft=kind_models["qwen3", "dflash2"][1], n_ctx=256,
               n_threads=1) as llm:
        assert len(llm.generate("ok", max_tokens=4, ignore_eos=True).tokens) == 4


def test_incomplete_dflash2_and_dspark_files_are_refused(kind_models, tmp_path):
    t = kind_models["qwen3", "dflash"][0]
    lone = {"selector_hidden.weight": "dflash.selector_top_k is missing", "markov_w1.weight": "markov_w2.weight is missing"}
    for tensor, message in lone.items():
        spec = dataclasses.replace(drafter_spec("qwen3", V()), extra_tensors=(tensor,))
        d = gguf_writers.write_drafter(tmp_path / f"{tensor}.gguf", QWEN3, spec)
        with pytest.raises(DraftCompatibilityError, match=message):
            Llama(t, draft=d, n_ctx=256, n_threads=1)


# -- temperature > 0 --------------------------------------------------------------


# (target, variant, verify, block position whose reach is floored, floor). A peaked
# target at T = 1 and a lattice that mostly follows the drafter's argmax: the one-hot
# DFlash2 drafts reach deep (measured at N = 100: 0.71 at position 7, rejection).
# The DSpark anchor row's q is far from this target's p: its drafts are mostly
# rejected, so the residual path runs at almost every step (reach 0.13 at position 1).
PEAKED = gguf_writers.TargetSpec(head_scale=1.5, hot_tokens=24, seed=5, embd_common=6.0)
SAMPLING = {
    "dflash2-rejection": (PEAKED, V("dflash2", selector_scale=0.5), "rejection", 7, 0.3),
    "dflash2-match": (PEAKED, V("dflash2", selector_scale=0.5), "match", 7, 0.3),
    "dspark-rejection": ("block", V("dspark"), "rejection", 1, 0.05),
}


@pytest.mark.parametrize("setting", list(SAMPLING))
def test_sampled_blocks_keep_the_target_distribution(tmp_path_factory, setting):
    # test_block_sampling's check (see its docstring): the first k + 1 tokens of N
    # generations against the exact distributions of the target alone
    from support import blocks

    tspec, variant, verify, pos, floor = SAMPLING[setting]
    tspec = blocks.QWEN3 if tspec == "block" else tspec
    d = tmp_path_factory.mktemp(f"sampling-{setting}")
    t, dp = gguf_writers.write_pair(d, tspec, gguf_writers.DrafterSpec(seed=9, attn_out_scale=2.0, variant=variant))
    with Llama(t, draft=dp, n_ctx=256, n_threads=1) as llm, Llama(t, n_ctx=256, n_threads=1) as base:
        k = llm.pair.max_draft
        seqs, reach = blocks.sample_blocks(llm, blocks.N, k, blocks.PLAIN, verify)
        pvals = blocks.target_pvalues(base, seqs, blocks.PLAIN)
    print(f"\n{setting}: reach {np.round(reach, 3).tolist()}; min p-value {min(pvals):.3g}")
    assert blocks.passes(pvals), np.round(pvals, 6).tolist()
    assert reach[pos] >= floor and reach[1] < 0.99, reach  # deep positions reached, rejections too


# -- the same counts as llama.cpp's own loop ------------------------------------------


STEP_LINE = re.compile(r"draft candidate\s+0, pos\s+\d+:\s+(\d+)|accepted (\d+)/(\d+) draft tokens")


def native_counts(exe: Path, target: Path, draft: Path, kind: str, prompt: str, n_predict: int, n_max: int,
                  tmp: Path) -> dict:
    """llama-speculative-simple's figures, and per step (from its debug log) the
    drafter's token at each position read (DFlash2 logs none) and the step's
    drafted and accepted counts."""
    (tmp / "prompt.txt").write_text(prompt, encoding="utf-8")
    spec_type = "draft-dspark" if kind.startswith("dspark") else "draft-dflash"
    cmd = [str(exe), "-m", str(target), "-md", str(draft), "--spec-type", spec_type,
           "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
           "-f", str(tmp / "prompt.txt"), "-n", str(n_predict), "-c", "1024", "-b", "1024", "-ub", "512",
           "-t", "1", "--temp", "0", "--top-k", "1", "--seed", "0", "--ignore-eos", "--no-escape",
           "-ngl", "0", "-ngld", "0", "-lv", "5"]
    # no reruns: tools/build_native.py links in a flush of its log at exit, so
    # a run whose figures are missing is a failure of that build
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    figures = dict(parse_native_output(out))
    steps, tokens = [], []
    for m in STEP_LINE.finditer(out):
        if m.group(1) is not None:
            tokens.append(int(m.group(1)))
        else:
            steps.append((tokens, int(m.group(3)), int(m.group(2))))
            tokens = []
    return {**figures, "steps": steps}


def pydflash_counts(llm: Llama, prompt: str, n_predict: int, n_max: int) -> dict:
    """pydflash's steps with llama-speculative-simple's per-step limits: at most
    n_predict - generated - 1 drafts, where 0 or less means no limit (llama.cpp
    truncates a draft only to a positive n_max), until more than n_predict."""
    tokens = llm.tokenize(prompt)
    pair = llm.pair
    pair.prefill(tokens)
    generated = drafted = accepted = 0
    steps = []
    while generated <= n_predict:
        cap = min(n_max, n_predict - generated - 1)
        r = pair.step(cap if cap > 0 else n_max)
        generated += len(r.tokens)
        drafted += r.n_drafted
        accepted += r.n_accepted
        steps.append((list(r.drafted), r.n_drafted, r.n_accepted))
    return {"isl": len(tokens), "n_generated": generated, "n_drafted": drafted, "n_accepted": accepted,
            "steps": steps}


# QWEN3's drafts are often accepted but nearly constant (its next token moves little
# with the context); TargetSpec()'s vary with the context and are mostly rejected:
# together they pin both the accepted counts and the drafted tokens
NATIVE_CASES = [pytest.param(t, k, id=f"{t}-{k}") for t in ("qwen3", "qwen3-varied") for k in KINDS] + \
               [pytest.param("hybrid", k, id=f"hybrid-{k}") for k in ("dflash", "dflash2", "dspark")]


@pytest.mark.parametrize("target,kind", NATIVE_CASES)
def test_counts_equal_llama_cpp_native(kind_models, tmp_path, target, kind):
    exe = speculative_simple()
    t, d = kind_models[target, kind]
    distinct: set[int] = set()
    with Llama(t, draft=d, n_ctx=1024, n_threads=1) as llm:
        n_max = llm.pair.max_draft
        for prompt in ("def main(argv=None):", "The quick brown fox jumps over"):
            ours = pydflash_counts(llm, prompt, 40, n_max)
            theirs = native_counts(exe, t, d, kind, prompt, 40, n_max, tmp_path)
            figures = ("isl", "n_generated", "n_drafted", "n_accepted")
            print(f"\n{target}-{kind} {prompt!r}: pydflash {[ours[k] for k in figures]}, "
                  f"llama.cpp {[theirs[k] for k in figures]} ({figures})")
            assert [ours[k] for k in figures] == [theirs[k] for k in figures]
            assert ours["n_drafted"] > 0
            # step by step: drafted and accepted counts, and the drafted tokens (llama.cpp
            # logs the drafter's token of every position it read, before truncating)
            assert [s[1:] for s in ours["steps"]] == [s[1:] for s in theirs["steps"]]
            if kind != "dflash2":
                for (mine, n, _), (logged, _, _) in zip(ours["steps"], theirs["steps"], strict=True):
                    assert mine == logged[:n]
            distinct.update(tok for s in ours["steps"] for tok in s[0])
    if target == "qwen3":
        assert ours["n_accepted"] > 0
    else:  # the drafts vary: a drafter stuck on one token would prove little
        assert len(distinct) >= 3


@pytest.mark.parametrize("p_min", [0.3, 0.6])
def test_a_confidence_cut_cuts_where_llama_cpp_cuts(p_min):
    # llama.cpp's draft_p_min (--spec-draft-p-min) tests the drafter's token against the
    # softmax of its top 10 logits (its draft sampler: top-k 10, then the distribution);
    # on the shipped pair, whose drafter is sure of some tokens and not of others, both
    # loops cut the same drafts at the same positions
    import pydflash
    from support.native_loop import matches_native, native_steps

    target, drafter = pydflash.embedded_pair()
    prompt = "def fibonacci(n):\n    "
    with Llama(target, draft=drafter, n_ctx=2048, n_threads=2) as llm:
        res = llm.generate(prompt, max_tokens=100, ignore_eos=True, draft_max=7, draft_p_min=p_min)
    ours = [(s.n_accepted, s.n_drafted) for s in res.stats.steps]
    assert any(0 < n < 7 for _, n in ours)  # some drafts were cut past their first token
    native = native_steps(target, prompt, 100, "draft-dflash", draft=drafter,
                          extra=("--spec-draft-p-min", str(p_min)))
    matches_native(ours, native)
