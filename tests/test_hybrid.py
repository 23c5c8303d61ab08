"""Hybrid (Gated-DeltaNet + attention) targets: Qwen3.5/3.6's ``qwen35``,
``qwen35moe`` and ``qwen3next``. Rejected draft tokens cannot be trimmed from a
recurrent state: the pair rolls back through llama.cpp's state planes
(qwen35, qwen35moe) or through checkpoints (qwen3next, or qwen35 with
rollback="checkpoint"). The lossless suite runs on every path: DFlash greedy
== target greedy, token for token."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pydflash import DraftCompatibilityError, Llama, gguf_writers
from pydflash.cli import main as cli_main
from support.lossless import N_TOKENS, PROMPTS, TEXT_PROMPTS, check_stats
from support.models import HYBRID_DRAFTERS, HYBRID_TARGETS
from support.pairs import PAIRS, THREADS, open_pair


@pytest.fixture(scope="module")
def bases(hybrid_models):
    llms = {arch: Llama(hybrid_models / f"{arch}-target.gguf", n_ctx=1024, n_threads=THREADS)
            for arch in HYBRID_TARGETS}
    yield llms
    for llm in llms.values():
        llm.close()


@pytest.fixture(scope="module")
def reference(bases):
    cache: dict[tuple[str, str], list[int]] = {}

    def ref(arch: str, prompt, n: int = N_TOKENS) -> list[int]:
        key = (arch, repr(prompt))
        if key not in cache or len(cache[key]) < n:
            res = bases[arch].generate(prompt, max_tokens=max(n, N_TOKENS), ignore_eos=True)
            assert len(res.tokens) == max(n, N_TOKENS)
            cache[key] = res.tokens
        return cache[key][:n]

    return ref


@pytest.fixture(scope="module")
def pairs(hybrid_models):
    opened: dict[str, Llama] = {}

    def get(name: str) -> tuple[str, Llama]:
        if name not in opened:
            opened[name] = open_pair(hybrid_models, name)
        return PAIRS[name][0], opened[name]

    yield get
    for llm in opened.values():
        llm.close()


@pytest.fixture(params=sorted(PAIRS))
def hybrid(request, pairs):
    return pairs(request.param)


# the whole prompt set on one pair per rollback path and drafter shape; a
# spread of it on the others (same code paths, other models)
FULL = ("qwen35-b8", "qwen35-b16", "qwen3next-b8")
LOSSLESS_CASES = [pytest.param(name, p.values[0], id=f"{name}-{p.id}")
                  for name in sorted(PAIRS) for i, p in enumerate(PROMPTS) if name in FULL or i % 3 == 0]


def test_rollback_kind(hybrid_models):
    for name, (arch, drafter, _, kind) in PAIRS.items():
        with open_pair(hybrid_models, name) as llm:
            assert llm.rollback == kind, name
            assert llm.pair.rollback == kind
            block = HYBRID_DRAFTERS[drafter].block_size
            # planes for every draft length up to the block: draft_max may change per call
            assert llm.pair.n_rs_seq == (block - 1 if kind == "recurrent-planes" else 0)
            assert f"rollback={kind}" in repr(llm.pair)
    # without a drafter only external drafts need a rollback: no planes are kept
    with Llama(hybrid_models / "qwen35-target.gguf", n_ctx=256, n_threads=THREADS) as plain:
        assert plain.rollback == "checkpoint" and plain.pair.n_rs_seq == 0


def test_attention_targets_keep_kv_trim(target_path, model_dir):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256) as llm:
        assert llm.rollback == "kv-trim" and llm.pair.n_rs_seq == 0


@pytest.mark.parametrize("name,prompt", LOSSLESS_CASES)
def test_dflash_greedy_equals_target_greedy(pairs, reference, name, prompt):
    arch, llm = pairs(name)
    expected = reference(arch, prompt)
    block = llm.pair.block_size
    for draft_max in sorted(d for d in {1, 2, 4, 8, block - 1} if d < block):
        res = llm.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=draft_max)
        assert res.tokens == expected, f"draft_max={draft_max} diverged"
        assert res.finish_reason == "length"
        check_stats(res, draft_max)


@pytest.mark.parametrize("prompt", [TEXT_PROMPTS[0], TEXT_PROMPTS[3], TEXT_PROMPTS[9]])
def test_every_draft_length(hybrid, reference, prompt):
    arch, llm = hybrid
    expected = reference(arch, prompt)
    for draft_max in range(1, llm.pair.block_size):
        res = llm.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=draft_max)
        assert res.tokens == expected, f"draft_max={draft_max} diverged"
        check_stats(res, draft_max)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_fixed_default_draft_length_is_block_minus_one(hybrid_models, reference, name):
    # the default adapts (test_adaptive_draft.py); draft_adaptive=False is the fixed one
    arch = PAIRS[name][0]
    with open_pair(hybrid_models, name, draft_adaptive=False) as llm:
        res = llm.generate(TEXT_PROMPTS[0], max_tokens=N_TOKENS, ignore_eos=True)
        block = llm.pair.block_size
    assert res.tokens == reference(arch, TEXT_PROMPTS[0])
    assert max(s.n_drafted for s in res.stats.steps) == block - 1


def test_partial_acceptances_happen(hybrid, reference):
    # the random drafter agrees now and then: accepted paths and partial
    # rejections (the rollbacks under test) both run (whole blocks pinned: the adaptive
    # length stops drafting for a random drafter)
    arch, llm = hybrid
    first = partial = accepted = 0
    for prompt in TEXT_PROMPTS[:6]:
        res = llm.generate(prompt, max_tokens=N_TOKENS, ignore_eos=True, draft_max=llm.pair.max_draft)
        assert res.tokens == reference(arch, prompt)
        accepted += res.stats.n_accepted
        first += sum(1 for s in res.stats.steps if s.n_drafted > 0 and s.n_accepted == 0)
        partial += sum(1 for s in res.stats.steps if 0 < s.n_accepted < s.n_drafted)
    assert accepted > 0 and partial > 0 and first > 0


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_long_prompt_in_chunks(hybrid_models, reference, name):
    # prefill in several decodes (n_batch 64) and ubatches before the first rollback
    arch, drafter, rollback, _ = PAIRS[name]
    prompt = [(37 * i + 11) % 380 for i in range(300)]
    with Llama(hybrid_models / f"{arch}-target.gguf", draft=hybrid_models / f"{arch}-drafter-{drafter}.gguf",
               n_ctx=1024, n_batch=64, n_threads=THREADS, rollback=rollback) as llm:
        res = llm.generate(prompt, max_tokens=64, ignore_eos=True)
    assert res.tokens == reference(arch, prompt, 64)


def test_draft_max_zero_is_plain_decoding(hybrid, reference):
    arch, llm = hybrid
    res = llm.generate(TEXT_PROMPTS[1], max_tokens=40, ignore_eos=True, draft_max=0)
    assert res.tokens == reference(arch, TEXT_PROMPTS[1])[:40]
    assert res.stats.n_drafted == 0 and res.stats.n_steps == 40


def test_max_tokens_cuts_last_step(hybrid, reference):
    arch, llm = hybrid
    for n in (1, 2, 3, 5, 17):
        res = llm.generate(TEXT_PROMPTS[2], max_tokens=n, ignore_eos=True)
        assert res.tokens == reference(arch, TEXT_PROMPTS[2])[:n]


def test_repeated_generate_with_changing_draft_max(hybrid, reference):
    # one object, many calls: every call starts from a clean recurrent state,
    # and draft_max moves up and down within the planes sized at load
    arch, llm = hybrid
    block = llm.pair.block_size
    schedule = [block - 1, 1, 3, None, 2, block - 1, 5, 1, None, 4]
    for i, dm in enumerate(schedule):
        prompt = PROMPTS[i % len(PROMPTS)].values[0]
        res = llm.generate(prompt, max_tokens=64, ignore_eos=True, draft_max=dm)
        assert res.tokens == reference(arch, prompt)[:64], f"call {i} (draft_max={dm}) diverged"


@pytest.mark.parametrize("verify", ["rejection", "match"])
def test_sampling_runs(hybrid, verify):
    arch, llm = hybrid
    a = llm.generate(TEXT_PROMPTS[0], max_tokens=48, temperature=0.8, top_k=20, seed=3, ignore_eos=True,
                     verify=verify)
    b = llm.generate(TEXT_PROMPTS[0], max_tokens=48, temperature=0.8, top_k=20, seed=3, ignore_eos=True,
                     verify=verify)
    assert len(a.tokens) == 48 and all(0 <= t < llm.n_vocab() for t in a.tokens)
    assert a.tokens == b.tokens  # same seed, same object: same sample
    check_stats(a, llm.pair.block_size - 1)


def test_recurrent_layers_matter(tmp_path, reference):
    """The recurrent layers really steer the output: the same target with its
    Gated-DeltaNet outputs zeroed (every other weight identical) continues
    differently. So a recurrent state left holding rejected tokens would show
    up in the lossless tests above."""
    spec = dataclasses.replace(HYBRID_TARGETS["qwen35"], ssm_out_scale=0.0)
    path = gguf_writers.write_hybrid_target(tmp_path / "no-recurrence.gguf", spec)
    differ = 0
    with Llama(path, n_ctx=512, n_threads=THREADS) as llm:
        for prompt in TEXT_PROMPTS:
            differ += llm.generate(prompt, max_tokens=32, ignore_eos=True).tokens != reference("qwen35", prompt)[:32]
    assert differ >= len(TEXT_PROMPTS) - 1


def test_refused_rollbacks(hybrid_models, target_path, model_dir):
    q35 = hybrid_models / "qwen35-target.gguf"
    # a recurrent state cannot be trimmed like a KV cache: refused at load, never wrong output
    with pytest.raises(DraftCompatibilityError, match="recurrent state"):
        Llama(q35, draft=hybrid_models / "qwen35-drafter-b8.gguf", n_ctx=256, rollback="kv-trim")
    # qwen3next has no partial rollback in llama.cpp (n_rs_seq is clamped to 0)
    with pytest.raises(DraftCompatibilityError, match="no partial recurrent-state rollback"):
        Llama(hybrid_models / "qwen3next-target.gguf", draft=hybrid_models / "qwen3next-drafter-b8.gguf",
              n_ctx=256, rollback="recurrent-planes")
    with pytest.raises(ValueError, match="no recurrent state"):
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256, rollback="checkpoint")
    with pytest.raises(ValueError, match="rollback must be one of"):
        Llama(q35, n_ctx=256, rollback="trim")


def test_rope_sections_drafter_drafts_like_neox(hybrid_models, reference):
    """A drafter with rope sections (3, 3, 2, 0) reads 4 positions per
    injected token. With the positions llama.cpp gives them, {p, p, p, 0} (and
    {p, p, p, p} for the block's tokens), its multi-section RoPE reduces to
    plain NeoX RoPE: the same weights without sections draft the same blocks."""
    target = hybrid_models / "qwen35-target.gguf"
    drafts = []
    for name in ("b8", "b8-nosections"):
        with Llama(target, draft=hybrid_models / f"qwen35-drafter-{name}.gguf", n_ctx=512, n_threads=THREADS) as llm:
            assert ("dflash.rope.dimension_sections" in llm.draft_metadata) == (name == "b8")
            out = []
            for prompt in TEXT_PROMPTS[:6]:
                # the blocks are compared: the same (fixed) lengths on both
                res = llm.generate(prompt, max_tokens=48, ignore_eos=True, draft_max=llm.pair.max_draft)
                assert res.tokens == reference("qwen35", prompt)[:48]
                out.append([list(s.drafted) for s in res.stats.steps])
            drafts.append(out)
    assert drafts[0] == drafts[1]


def test_checkpoint_replay_feeds_the_drafter_the_same_features(pairs, reference):
    """After a restored checkpoint the drafter is fed the replay pass's
    features, after a plane rollback the verification pass's: both are the
    target's features of the same tokens, so both draft the same blocks (a
    wrong injection would change the drafts, not the lossless output)."""
    _, planes = pairs("qwen35-b8")
    _, ckpt = pairs("qwen35-b8-checkpoint")
    for prompt in TEXT_PROMPTS[:6]:
        # the blocks are compared: the same (fixed) lengths on both
        a = planes.generate(prompt, max_tokens=64, ignore_eos=True, draft_max=planes.pair.max_draft)
        b = ckpt.generate(prompt, max_tokens=64, ignore_eos=True, draft_max=ckpt.pair.max_draft)
        assert a.tokens == b.tokens == reference("qwen35", prompt)[:64]
        assert [list(s.drafted) for s in a.stats.steps] == [list(s.drafted) for s in b.stats.steps]


@pytest.mark.parametrize("arch,kind", [("qwen35", "recurrent-planes"), ("qwen35moe", "recurrent-planes"),
                                       ("qwen3next", "checkpoint")])
def test_info_names_the_rollback(hybrid_models, capsys, arch, kind):
    assert cli_main(["info", "-m", str(hybrid_models / f"{arch}-target.gguf"),
                     "-d", str(hybrid_models / f"{arch}-drafter-b8.gguf")]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"^  rollback +{kind}\b", out, re.M), out
    assert "drafter fits target: yes" in out


def test_info_json_rollback_of_an_attention_target(target_path, capsys):
    import json

    assert cli_main(["info", "-m", str(target_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["rollback"] == "kv-trim"
