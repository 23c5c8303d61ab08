from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pydflash import Llama, gguf_writers
from support.http import serve
from support.models import DRAFTERS, HYBRID_DRAFTERS, HYBRID_TARGETS, SPREAD, SPREAD_DRAFTER, TARGET
from support.phrases import SPEC as PHRASE_SPEC
from support.phrases import TOOL_TEMPLATE, write_phrase_target


@pytest.fixture(scope="session", autouse=True)
def one_compute_thread():
    """Every Llama a test makes computes on one thread unless the test names n_threads (the
    tests of threads do): the models are tiny, and on a shared machine a second OpenMP
    worker mostly spins (150 two-token generations took 150-176 s with every hardware
    thread, 0.3-1.0 s with one). A CLI's Llama gets its -t flag (None: every core) as given."""
    init = Llama.__init__

    def pinned(self, *args, **kwargs):
        kwargs.setdefault("n_threads", 1)
        init(self, *args, **kwargs)

    Llama.__init__ = pinned  # type: ignore[method-assign]
    yield
    Llama.__init__ = init  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    gguf_writers.write_target(d / "target.gguf", TARGET)
    for name, spec in DRAFTERS.items():
        gguf_writers.write_drafter(d / f"drafter-{name}.gguf", TARGET, spec)
    gguf_writers.write_target(d / "target-eos.gguf", dataclasses.replace(TARGET, eos_hot=True))
    gguf_writers.write_drafter(d / "drafter-eos.gguf", TARGET, DRAFTERS["b8"])
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


@pytest.fixture(scope="session")
def hybrid_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hybrid")
    for arch, spec in HYBRID_TARGETS.items():
        gguf_writers.write_hybrid_target(d / f"{arch}-target.gguf", spec)
    for name, dspec in HYBRID_DRAFTERS.items():
        gguf_writers.write_drafter(d / f"qwen35-drafter-{name}.gguf", HYBRID_TARGETS["qwen35"], dspec)
    # the same weights without rope sections (plain NeoX RoPE)
    gguf_writers.write_drafter(d / "qwen35-drafter-b8-nosections.gguf", HYBRID_TARGETS["qwen35"],
                          dataclasses.replace(HYBRID_DRAFTERS["b8"], rope_sections=None))
    gguf_writers.write_drafter(d / "qwen35moe-drafter-b8.gguf", HYBRID_TARGETS["qwen35moe"], HYBRID_DRAFTERS["b8"])
    gguf_writers.write_drafter(d / "qwen3next-drafter-b8.gguf", HYBRID_TARGETS["qwen3next"],
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


@pytest.fixture(scope="module")
def spread_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The spread pair (support.models.SPREAD): target and drafter files."""
    d = tmp_path_factory.mktemp("spread")
    target = gguf_writers.write_target(d / "t.gguf", SPREAD)
    return target, gguf_writers.write_drafter(d / "d.gguf", SPREAD, SPREAD_DRAFTER)


@pytest.fixture(scope="module")
def spread_pair(spread_files: tuple[Path, Path]):
    """The spread pair with its drafter, and its target alone."""
    t, dr = spread_files
    with Llama(t, draft=dr, n_ctx=256) as llm, Llama(t, n_ctx=256) as base:
        yield llm, base


@pytest.fixture(scope="module")
def spread_server(spread_files: tuple[Path, Path]):
    """`pydflash serve` on the spread pair (a subprocess); its URL."""
    t, d = spread_files
    with serve("-m", str(t), "-d", str(d), "--n-ctx", "1024") as url:
        yield url


@pytest.fixture(scope="module")
def phrase_files(tmp_path_factory: pytest.TempPathFactory):
    """The phrase model (support.phrases): target, drafter, and each phrase's token id."""
    d = tmp_path_factory.mktemp("tools")
    ids = write_phrase_target(d / "t.gguf", TOOL_TEMPLATE)
    gguf_writers.write_drafter(d / "d.gguf", PHRASE_SPEC)
    return d / "t.gguf", d / "d.gguf", ids


@pytest.fixture(scope="module")
def block_models(tmp_path_factory: pytest.TempPathFactory):
    """support.blocks' pairs: their paths, and the Llamas blocks.open_llm opened (closed after)."""
    from support import blocks  # here, not at the top: it needs scipy, which only these tests do

    d = tmp_path_factory.mktemp("block")
    paths = {}
    for name, (tspec, dspec) in blocks.DRAFTERS.items():
        arch = "hybrid" if isinstance(tspec, gguf_writers.HybridSpec) else "qwen3"
        t = d / f"{arch}-{tspec.seed}-{tspec.head_scale}-target.gguf"
        if not t.exists():
            (gguf_writers.write_hybrid_target if arch == "hybrid" else gguf_writers.write_target)(t, tspec)
        paths[name] = (t, gguf_writers.write_drafter(d / f"{name}.gguf", tspec, dspec))
    opened: dict = {}
    yield paths, opened
    for llm in opened.values():
        llm.close()


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
