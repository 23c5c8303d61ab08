"""The recovery paths: a failing target decode, drafter decode or memory
removal raises DecodeError / RollbackError, leaves the pair reset, and the next
generation equals a fresh object's, token for token.

The failures are injected by a test hook in the C++ core (csrc/fault.h,
``_core.ContextPair._inject_fault(site, after_calls)``): the
(after_calls + 1)-th later call at that site fails as if llama.cpp had
returned an error. Targets: qwen3 (KV trim), qwen35 (recurrent-state planes)
and qwen3next (state checkpoints: save, restore, replay).
"""

from __future__ import annotations

import pytest

from pydflash import DecodeError, Llama, RollbackError, gguf_writers
from support.models import HYBRID_DRAFTERS, HYBRID_TARGETS, TARGET

PROMPT = [17, 42, 99, 250, 5, 33, 120]
N = 12
SAMPLED = dict(temperature=0.9, top_k=8, seed=3)


@pytest.fixture(scope="module")
def fault_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    out = {"qwen3": (gguf_writers.write_target(d / "q3.gguf", TARGET),
                     gguf_writers.write_drafter(d / "q3-d.gguf", TARGET, gguf_writers.DrafterSpec()))}
    for arch in ("qwen35", "qwen3next"):
        spec = HYBRID_TARGETS[arch]
        dspec = HYBRID_DRAFTERS["b8"] if arch == "qwen35" else gguf_writers.DrafterSpec(target_layers=(1, 3))
        out[arch] = (gguf_writers.write_hybrid_target(d / f"{arch}.gguf", spec),
                     gguf_writers.write_drafter(d / f"{arch}-d.gguf", spec, dspec))
    return out


ROLLBACK = {"qwen3": "kv-trim", "qwen35": "recurrent-planes", "qwen3next": "checkpoint"}
# site -> (exception, after_calls values): 0 fails in the prefill (decodes) or
# the first rollback; later values fail inside a step
SITES = {
    "target_decode": (DecodeError, (0, 2)),
    "drafter_decode": (DecodeError, (0, 3)),
    "memory_remove": (RollbackError, (0, 1)),
}


def generation(llm: Llama, kw: dict) -> list[int]:
    return llm.generate(PROMPT, max_tokens=N, ignore_eos=True, **kw).tokens


@pytest.mark.parametrize("arch", sorted(ROLLBACK))
def test_faults_raise_reset_and_recover(fault_models, arch):
    # fixed draft lengths: every step drafts and rolls back (an adaptive one may stop drafting)
    target, drafter = fault_models[arch]
    with Llama(target, draft=drafter, n_ctx=256, n_threads=1, draft_adaptive=False) as fresh:
        want = [generation(fresh, kw) for kw in ({}, SAMPLED)]
    with Llama(target, draft=drafter, n_ctx=256, n_threads=1, draft_adaptive=False) as llm:
        assert llm.pair.rollback == ROLLBACK[arch]
        core = llm.pair._core
        assert generation(llm, {}) == want[0]
        for site, (exc, afters) in SITES.items():
            for after in afters:
                for i, kw in enumerate(({}, SAMPLED)):
                    core._inject_fault(site, after)
                    with pytest.raises(exc, match="reset") as info:
                        llm.generate(PROMPT, max_tokens=N, ignore_eos=True, **kw)
                    if exc is DecodeError:
                        assert not isinstance(info.value, RollbackError)
                    # reset: nothing cached, nothing pending
                    assert llm.pair.n_past == 0 and llm.pair.tokens == [], (site, after)
                    # the fault fired once; the next generation equals a fresh object's
                    assert generation(llm, kw) == want[i], (site, after, kw)


def test_a_fault_in_the_step_api_resets_the_pair(fault_models):
    target, drafter = fault_models["qwen3"]
    with Llama(target, draft=drafter, n_ctx=256, n_threads=1) as llm:
        pair = llm.pair
        pair.set_sampling()
        pair.prefill(PROMPT)
        first = pair.step().tokens
        pair._core._inject_fault("target_decode", 0)
        with pytest.raises(DecodeError, match="target decode failed"):
            pair.step()
        assert pair.n_past == 0 and pair.tokens == []
        with pytest.raises(ValueError, match="prefill"):
            pair.step()  # nothing pending: the state is not silently reused
        pair.prefill(PROMPT)
        assert pair.step().tokens == first


def test_fault_hook_arguments(fault_models):
    target, drafter = fault_models["qwen3"]
    with Llama(target, draft=drafter, n_ctx=256, n_threads=1) as llm:
        core = llm.pair._core
        with pytest.raises(ValueError, match="unknown fault site"):
            core._inject_fault("disk", 0)
        with pytest.raises(ValueError, match="after_calls"):
            core._inject_fault("target_decode", -1)
        core._inject_fault("target_decode", 0)
        core._inject_fault("none", 0)  # disarmed
        assert len(llm.generate(PROMPT, max_tokens=5, ignore_eos=True).tokens) == 5
