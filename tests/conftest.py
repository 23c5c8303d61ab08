from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pydflash import Llama, testing

# Two drafter shapes over one target: block 8 / 1 layer / 2 target layers, and
# block 16 / 2 layers / 3 target layers with other head counts.
TARGET = testing.TargetSpec()
DRAFTERS = {
    "b8": testing.DrafterSpec(),
    "b16": testing.DrafterSpec(n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=96,
                               target_layers=(0, 2, 3), block_size=16, seed=7),
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    testing.write_target(d / "target.gguf", TARGET)
    for name, spec in DRAFTERS.items():
        testing.write_drafter(d / f"drafter-{name}.gguf", TARGET, spec)
    testing.write_target(d / "target-eos.gguf", dataclasses.replace(TARGET, eos_hot=True))
    testing.write_drafter(d / "drafter-eos.gguf", TARGET, DRAFTERS["b8"])
    return d


@pytest.fixture(scope="session")
def target_path(model_dir: Path) -> Path:
    return model_dir / "target.gguf"


@pytest.fixture(scope="session")
def baseline(target_path: Path):
    with Llama(target_path, n_ctx=1024) as llm:
        yield llm


@pytest.fixture(scope="session", params=sorted(DRAFTERS))
def dflash(request: pytest.FixtureRequest, model_dir: Path, target_path: Path):
    with Llama(target_path, draft=model_dir / f"drafter-{request.param}.gguf", n_ctx=1024) as llm:
        yield llm


@pytest.fixture(scope="session")
def dflash_b8(model_dir: Path, target_path: Path):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=1024) as llm:
        yield llm


# Hybrid targets (tests/test_hybrid*.py): qwen35 (the Qwen3.5/3.6 layout) and
# qwen35moe targets with multi-section-RoPE drafters, and a qwen3next target
# (checkpoint rollback).
HYBRID_TARGETS = {
    "qwen35": testing.HybridSpec(),
    "qwen35moe": testing.HybridSpec(architecture="qwen35moe", seed=9),
    "qwen3next": testing.HybridSpec(architecture="qwen3next", seed=5),
}
SECTIONS = HYBRID_TARGETS["qwen35"].rope_sections
HYBRID_DRAFTERS = {
    "b8": testing.DrafterSpec(target_layers=(1, 3), rope_sections=SECTIONS),
    "b16": testing.DrafterSpec(n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=96, target_layers=(0, 2, 3),
                               block_size=16, seed=7, rope_sections=(6, 5, 5, 0)),
}


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hybrid")
    for arch, spec in HYBRID_TARGETS.items():
        testing.write_hybrid_target(d / f"{arch}-target.gguf", spec)
    for name, dspec in HYBRID_DRAFTERS.items():
        testing.write_drafter(d / f"qwen35-drafter-{name}.gguf", HYBRID_TARGETS["qwen35"], dspec)
    # the same weights without rope sections (plain NeoX RoPE)
    testing.write_drafter(d / "qwen35-drafter-b8-nosections.gguf", HYBRID_TARGETS["qwen35"],
                          dataclasses.replace(HYBRID_DRAFTERS["b8"], rope_sections=None))
    testing.write_drafter(d / "qwen35moe-drafter-b8.gguf", HYBRID_TARGETS["qwen35moe"], HYBRID_DRAFTERS["b8"])
    testing.write_drafter(d / "qwen3next-drafter-b8.gguf", HYBRID_TARGETS["qwen3next"],
                          dataclasses.replace(HYBRID_DRAFTERS["b8"], rope_sections=None))
    return d


@pytest.fixture(scope="session")
def embedded_dflash():
    """The embedded trained pair (real logit scales, an accepted drafter)."""
    import pydflash

    target, drafter = pydflash.embedded_pair()
    with Llama(target, draft=drafter, n_ctx=1024) as llm:
        yield llm


@pytest.fixture(scope="session")
def embedded_target():
    """The embedded pair's target alone."""
    import pydflash

    target, _ = pydflash.embedded_pair()
    with Llama(target, n_ctx=1024) as llm:
        yield llm


# Session-scoped Llama objects whose pair the step-API tests drive directly.
SHARED_LLAMAS = ("baseline", "dflash", "dflash_b8", "embedded_dflash", "embedded_target")


@pytest.fixture
def llama_configs(monkeypatch: pytest.MonkeyPatch) -> list:
    """The config of every Llama made while the test runs (what CLI flags reached)."""
    seen: list = []
    init = Llama.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(self.config)

    monkeypatch.setattr(Llama, "__init__", recording_init)
    return seen


@pytest.fixture(autouse=True)
def fresh_shared_pairs(request: pytest.FixtureRequest):
    """pair.step() decodes with whatever sampler the last generate() set (a
    temperature, penalties, a bias): each test starts from greedy sampling and
    empty caches on every shared object it uses, whatever ran before it."""
    for name in SHARED_LLAMAS:
        if name in request.fixturenames:
            pair = request.getfixturevalue(name).pair
            pair.set_sampling()
            pair.reset()
    yield
