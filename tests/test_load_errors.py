"""Every bad file gets its own exception class and a message naming the file
and the reason; the process stays alive and the next valid load works."""

from __future__ import annotations

import dataclasses
import gc
import os
from pathlib import Path

import pytest

import pydflash
from pydflash import DraftCompatibilityError, Llama, ModelLoadError, PyDFlashError, gguf_writers
from support.models import TARGET

D = gguf_writers.DrafterSpec()


def drafter(tmp_path: Path, name: str, target=TARGET, **changes) -> Path:
    return gguf_writers.write_drafter(tmp_path / f"{name}.gguf", target, dataclasses.replace(D, **changes))


def assert_recovers(target_path: Path, drafter_path: Path) -> None:
    with Llama(target_path, draft=drafter_path, n_ctx=256) as llm:
        assert len(llm.generate("ok", max_tokens=4, ignore_eos=True).tokens) == 4


def load_error(exc_type, match, target, draft=None):
    with pytest.raises(exc_type, match=match) as info:
        Llama(target, draft=draft, n_ctx=256)
    assert isinstance(info.value, PyDFlashError)
    return str(info.value)


# -- files that cannot be loaded at all -------------------------------------------

def test_missing_file(tmp_path, target_path, model_dir):
    missing = tmp_path / "nope.gguf"
    msg = load_error(ModelLoadError, "file not found", missing)
    assert str(missing) in msg
    msg = load_error(ModelLoadError, "file not found", target_path, missing)
    assert str(missing) in msg
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


def test_directory(tmp_path, target_path):
    msg = load_error(ModelLoadError, "is a directory", tmp_path)
    assert str(tmp_path) in msg
    load_error(ModelLoadError, "is a directory", target_path, tmp_path)


def test_not_gguf(tmp_path, target_path):
    p = tmp_path / "text.gguf"
    p.write_text("hello, I am not a model")
    assert str(p) in load_error(ModelLoadError, "not a GGUF file", p)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    load_error(ModelLoadError, "not a GGUF file", target_path, empty)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.97])
def test_truncated_target(tmp_path, target_path, model_dir, keep):
    data = target_path.read_bytes()
    p = tmp_path / "truncated.gguf"
    p.write_bytes(data[: int(len(data) * keep)])
    msg = load_error(ModelLoadError, "truncated|corrupt|failed to load", p)
    assert str(p) in msg
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


def test_truncated_drafter(tmp_path, target_path, model_dir):
    data = (model_dir / "drafter-b8.gguf").read_bytes()
    p = tmp_path / "truncated-drafter.gguf"
    p.write_bytes(data[: len(data) // 2])
    assert str(p) in load_error(ModelLoadError, "truncated|corrupt|failed to load", target_path, p)


@pytest.mark.parametrize("seed", range(4))
def test_random_bytes_behind_magic(tmp_path, target_path, model_dir, seed):
    rnd = __import__("random").Random(seed)
    p = tmp_path / f"garbage{seed}.gguf"
    p.write_bytes(b"GGUF" + bytes(rnd.getrandbits(8) for _ in range(4096)))
    assert str(p) in load_error(ModelLoadError, "corrupt|truncated|failed", p)
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


def test_unknown_architecture(tmp_path):
    p = gguf_writers.write_target(tmp_path / "alien.gguf", architecture="alien9000")
    msg = load_error(ModelLoadError, "alien9000", p)
    assert "unknown model architecture" in msg


def test_text_that_is_not_utf8(tmp_path, target_path):
    # a model file's strings are bytes: a bad byte in a key name or in the
    # architecture becomes U+FFFD in metadata, errors and logs, never a
    # UnicodeDecodeError that hides what happened (found by tools/fuzz_gguf.py)
    raw = gguf_writers.write_target(tmp_path / "t.gguf").read_bytes()
    assert raw.count(b"general.name") == 1
    odd = tmp_path / "odd-key.gguf"
    odd.write_bytes(raw.replace(b"general.name", b"general.n\xffme"))
    with Llama(odd, n_ctx=64) as llm:
        assert llm.metadata["general.n\ufffdme"] == "pydflash tiny qwen3 target"
        assert "general.name" not in llm.metadata
        assert len(llm.generate("x", max_tokens=2, ignore_eos=True).tokens) == 2
    assert "general.n\ufffdme" in pydflash.inspect_gguf(odd)["metadata"]
    arch = tmp_path / "odd-arch.gguf"
    arch.write_bytes(raw.replace(b"qwen3", b"qw\xc3n3"))
    msg = load_error(ModelLoadError, "unknown model architecture", arch)
    assert "qw\ufffdn3" in msg


def test_pre_merge_dflash_draft_format(tmp_path, target_path, model_dir):
    p = drafter(tmp_path, "old", architecture="dflash-draft")
    msg = load_error(ModelLoadError, "dflash-draft", target_path, p)
    assert str(p) in msg
    assert "re-convert" in msg and "'dflash'" in msg
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


# -- drafters that load but do not fit -----------------------------------------------

def test_target_passed_as_drafter(target_path, model_dir):
    msg = load_error(DraftCompatibilityError, "architecture is 'qwen3', expected 'dflash'", target_path, target_path)
    assert str(target_path) in msg
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


def test_hidden_size_mismatch(tmp_path, target_path):
    p = drafter(tmp_path, "wide", n_embd=96)
    msg = load_error(DraftCompatibilityError, "hidden size 96 differs from the target's 64", target_path, p)
    assert str(p) in msg


def test_vocab_size_mismatch(tmp_path, target_path):
    p = drafter(tmp_path, "vocab", n_vocab=400)
    load_error(DraftCompatibilityError, "vocabulary size 400 differs from the target's 384", target_path, p)


@pytest.mark.parametrize("layers", [(1, 4), (9,), (0, 1, 2, 3, 17)])
def test_target_layer_out_of_range(tmp_path, target_path, model_dir, layers):
    p = drafter(tmp_path, "layers", target_layers=layers)
    msg = load_error(DraftCompatibilityError, r"target layer id \d+ is out of range: the target has 4 layers",
                     target_path, p)
    assert str(p) in msg
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")


def test_no_mask_token(tmp_path, target_path):
    p = drafter(tmp_path, "nomask", mask_token=False)
    load_error(DraftCompatibilityError, "no mask token", target_path, p)


# complete DFlash2 / DSpark / d2t drafters load (tests/test_drafter_kinds.py); a lone
# tensor of one is an incomplete file, refused with what is missing
def test_incomplete_dspark_refused(tmp_path, target_path):
    p = drafter(tmp_path, "dspark", extra_tensors=("markov_w1.weight",))
    load_error(DraftCompatibilityError, "DSpark drafter: markov_w1.weight is present but markov_w2.weight is missing",
               target_path, p)


def test_incomplete_dflash2_refused(tmp_path, target_path):
    p = drafter(tmp_path, "dflash2", extra_tensors=("selector_hidden.weight",))
    load_error(DraftCompatibilityError, "DFlash2 drafter: metadata dflash.selector_top_k is missing", target_path, p)


def test_target_without_layer_inputs(tmp_path, model_dir):
    # a llama.cpp architecture whose graph exposes no layer inputs cannot feed a drafter
    t = gguf_writers.write_target(tmp_path / "xverse.gguf", TARGET, architecture="xverse")
    with Llama(t, n_ctx=256) as plain:  # the target alone decodes fine
        assert len(plain.generate("hi", max_tokens=3, ignore_eos=True).tokens) == 3
    load_error(DraftCompatibilityError, "does not expose layer inputs", t, model_dir / "drafter-b8.gguf")


def test_draft_max_above_the_block_is_refused_at_load(target_path, model_dir):
    with pytest.raises(ValueError, match="draft_max=8 exceeds this drafter's block size 8 minus 1 = 7"):
        Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256, draft_max=8)
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=256, draft_max=7) as llm:
        assert llm.pair.default_draft_max == 7


def test_bad_constructor_arguments(target_path):
    with pytest.raises(ValueError, match="n_ctx"):
        Llama(target_path, n_ctx=2)
    with pytest.raises(TypeError, match="n_ctx"):
        Llama(target_path, n_ctx="big")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_max"):
        Llama(target_path, draft_max=-1)
    with pytest.raises(TypeError):
        Llama(target_path, 1024)  # type: ignore[misc]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(".gguf"))


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")
def test_loading_failures_leak_no_handles(tmp_path, target_path, model_dir):
    # 200 refused loads in a row (the target loads, the drafter is refused):
    # every file handle and mapping is released, and memory stays bounded
    bad = drafter(tmp_path, "bad", n_embd=96)

    def refuse(n: int) -> None:
        for _ in range(n):
            with pytest.raises(DraftCompatibilityError):
                Llama(target_path, draft=bad, n_ctx=256)

    refuse(10)  # warm-up: allocator pools, lazy backend init, logging
    gc.collect()
    fds, maps, rss = _open_fds(), _mappings(), _rss_mib()
    refuse(200)
    gc.collect()
    # a leaked model keeps its file open or mapped (measured: each leaked target
    # adds one mapping and ~1.1 MiB of RSS), so one leak fails the mapping count
    # and 15 fail the RSS bound
    assert _open_fds() == fds, sorted(os.listdir("/proc/self/fd"))
    assert _mappings() == maps
    growth = _rss_mib() - rss
    assert growth < 16, f"RSS grew by {growth:.1f} MiB over 200 refused loads"
    assert_recovers(target_path, model_dir / "drafter-b8.gguf")
