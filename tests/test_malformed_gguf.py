"""The committed corpus of crafted bad GGUF files (tools/make_bad_gguf.py):
each one ends in the exception class its case names, with a message that says
why (tools/make_bad_gguf.py's expectations()). The files are loaded in a child
process, so a crash would be caught and reported (as the case that was
loading), not take the test run down.

DFlash-specific malformed drafters (block size, mask token, target layers,
rope sections) are written at test time with pydflash.gguf_writers and checked the
same way against the tiny target."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pydflash import gguf_writers
from support.models import TARGET

DATA = Path(__file__).parent / "data"
CASES = sorted((DATA / "bad_gguf").glob("*.gguf"))
TOOL = Path(__file__).resolve().parent.parent / "tools" / "make_bad_gguf.py"


def _tool():
    spec = importlib.util.spec_from_file_location("make_bad_gguf", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


WORKER = r"""
import json, sys
from pydflash import Llama, ModelLoadError, DraftCompatibilityError
good = sys.argv[1]
for path in sys.argv[2:]:
    for role in ("target", "drafter"):
        print("START", role, path, flush=True)
        try:
            if role == "target":
                Llama(path, n_ctx=64).close()
            else:
                Llama(good, draft=path, n_ctx=64).close()
            print("LOADED", role, path, flush=True)
        except (ModelLoadError, DraftCompatibilityError) as e:
            assert path in str(e), str(e)
            print("REFUSED", role, path, type(e).__name__, json.dumps(str(e)), flush=True)
"""


def run_all(paths: list[Path], good: Path = DATA / "good-tiny.gguf") -> tuple[dict, list[str]]:
    """Outcome per (role, path): "LOADED", "CRASH", "SKIPPED" or (exception
    class, message); restarts the worker after a crash."""
    results: dict[tuple[str, str], object] = {}
    crashes: list[str] = []
    todo = [str(p) for p in paths]
    while todo:
        proc = subprocess.run([sys.executable, "-c", WORKER, str(good), *todo],
                              capture_output=True, text=True, timeout=600)
        started = None
        for line in proc.stdout.splitlines():
            parts = line.split(" ", 4)
            if parts[0] == "START":
                started = (parts[1], parts[2])
            elif parts[0] == "LOADED":
                results[(parts[1], parts[2])] = "LOADED"
                started = None
            elif parts[0] == "REFUSED":
                results[(parts[1], parts[2])] = (parts[3], json.loads(parts[4]))
                started = None
        if proc.returncode == 0:
            break
        if started is None:
            raise AssertionError(f"worker failed outside a case:\n{proc.stderr[-3000:]}")
        crashes.append(f"{started} (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        results[started] = "CRASH"
        # resume after the crashing file
        todo = todo[todo.index(started[1]) + (1 if started[0] == "drafter" else 0):]
        if started[0] == "target":
            results[("drafter", started[1])] = "SKIPPED"
            todo = todo[1:]
    return results, crashes


def mismatches(results: dict, expected: dict[str, dict[str, tuple[str, tuple[str, ...]]]],
               path_of: dict[str, str]) -> list[str]:
    bad = []
    for name, roles in sorted(expected.items()):
        for role, (exc, fragments) in roles.items():
            got = results.get((role, path_of[name]))
            if not isinstance(got, tuple) or got[0] != exc or not all(f in got[1] for f in fragments):
                bad.append(f"{name} as {role}: expected {exc} with {fragments}, got {got}")
    return bad


def test_corpus_is_present_and_matches_the_tool():
    assert len(CASES) >= 100
    assert (DATA / "good-tiny.gguf").is_file()
    tool = _tool()
    cases = tool.cases()
    # the committed files are the tool's output (regenerate: python tools/make_bad_gguf.py)
    assert sorted(p.stem for p in CASES) == sorted(cases)
    assert [p.stem for p in CASES if p.read_bytes() != cases[p.stem]] == []
    assert set(tool.expectations()) == set(cases)


def test_every_bad_file_gets_its_own_error():
    results, crashes = run_all(CASES)
    assert not crashes, "\n".join(crashes)
    loaded = sorted(f"{r} {Path(p).name}" for (r, p), v in results.items() if v == "LOADED")
    assert not loaded, f"loaded although malformed: {loaded}"
    assert len(results) == 2 * len(CASES)
    bad = mismatches(results, _tool().expectations(), {p.stem: str(p) for p in CASES})
    assert not bad, "\n".join(bad)


def test_the_good_file_loads_in_the_same_harness():
    results, crashes = run_all([DATA / "good-tiny.gguf"])
    assert not crashes
    assert results[("target", str(DATA / "good-tiny.gguf"))] == "LOADED"


# -- DFlash-specific malformed drafters -------------------------------------------------

def bad_drafter(path: Path, *, block_size: int = 8, target_layers=(1, 3), mask: int | None = None,
                rope_sections=None, fc_layers: int | None = None) -> Path:
    """The default tiny drafter with one DFlash field broken (written with any
    value the GGUF type holds)."""
    d = gguf_writers.DrafterSpec()
    rng = np.random.default_rng(1)
    hp = gguf_writers.Hparams(TARGET.n_ctx, TARGET.n_embd, d.n_layer, d.n_head, d.n_head_kv, d.head_dim, d.n_ff)
    n_in = (len(target_layers) if fc_layers is None else fc_layers) * TARGET.n_embd
    tensors = {"fc.weight": (rng.standard_normal((TARGET.n_embd, max(n_in, 1))) * 0.1).astype(np.float32),
               "enc.output_norm.weight": np.ones(TARGET.n_embd, np.float32)}
    s = 1 / np.sqrt(TARGET.n_embd)
    for name, shape in (("attn_q", (d.n_head * d.head_dim, TARGET.n_embd)),
                        ("attn_k", (d.n_head_kv * d.head_dim, TARGET.n_embd)),
                        ("attn_v", (d.n_head_kv * d.head_dim, TARGET.n_embd)),
                        ("attn_output", (TARGET.n_embd, d.n_head * d.head_dim)),
                        ("ffn_gate", (d.n_ff, TARGET.n_embd)), ("ffn_up", (d.n_ff, TARGET.n_embd)),
                        ("ffn_down", (TARGET.n_embd, d.n_ff))):
        tensors[f"blk.0.{name}.weight"] = (rng.standard_normal(shape) * s).astype(np.float32)
    for name, n in (("attn_norm", TARGET.n_embd), ("attn_q_norm", d.head_dim), ("attn_k_norm", d.head_dim),
                    ("ffn_norm", TARGET.n_embd)):
        tensors[f"blk.0.{name}.weight"] = np.ones(n, np.float32)
    tensors["output_norm.weight"] = np.ones(TARGET.n_embd, np.float32)
    tok = gguf_writers.tokenizer(TARGET.n_vocab)
    if mask is not None:
        tok = dataclasses.replace(tok, mask=mask)
    return gguf_writers.write_dflash_gguf(path, hp, tok, tensors, block_size=block_size, target_layers=target_layers,
                                     name="malformed dflash drafter", rope_sections=rope_sections)


DC, ML = "DraftCompatibilityError", "ModelLoadError"
RANGE = "is out of range: the target has 4 layers (valid ids 0..3)"
# name: (the broken field, expected class, message fragments)
DFLASH_CASES = {
    "block-size-0": (dict(block_size=0), DC, ("dflash.block_size 0 is out of range [2, 256]",)),
    "block-size-1": (dict(block_size=1), DC, ("dflash.block_size 1 is out of range [2, 256]",)),
    "block-size-257": (dict(block_size=257), DC, ("dflash.block_size 257 is out of range [2, 256]",)),
    "block-size-2^31": (dict(block_size=2**31), DC, ("dflash.block_size 2147483648 is out of range [2, 256]",)),
    "block-size-u32-max": (dict(block_size=2**32 - 1), DC, ("dflash.block_size 4294967295 is out of range",)),
    "mask-id-n-vocab": (dict(mask=384), DC, ("no mask token (tokenizer.ggml.mask_token_id)",)),
    "mask-id-huge": (dict(mask=10**6), DC, ("no mask token",)),
    "mask-id-u32-max": (dict(mask=2**32 - 1), DC, ("no mask token",)),
    "target-layers-empty": (dict(target_layers=()), ML, ("requires 'target_layers'",)),
    "target-layers-negative": (dict(target_layers=(-1, 3)), DC, ("target layer id -1 " + RANGE,)),
    "target-layers-past-the-end": (dict(target_layers=(1, 4)), DC, ("target layer id 4 " + RANGE,)),
    "target-layers-i32-max": (dict(target_layers=(1, 2**31 - 1)), DC, ("target layer id 2147483647 " + RANGE,)),
    "fc-width-not-the-layer-count": (dict(fc_layers=3), ML, ("tensor 'fc.weight' has wrong shape",)),
    "rope-sections-3": (dict(rope_sections=(3, 3, 2)), ML,
                        ("dflash.rope.dimension_sections has wrong array length; expected 4, got 3",)),
    "rope-sections-5": (dict(rope_sections=(3, 3, 2, 0, 0)), ML, ("wrong array length; expected 4, got 5",)),
    "rope-sections-past-n-rot": (dict(rope_sections=(100, 0, 0, 0)), ML,
                                 ("dflash.rope.dimension_sections [100, 0, 0, 0]", "n_rot")),
    "rope-sections-negative": (dict(rope_sections=(-4, 2, 2, 0)), ML,
                               ("dflash.rope.dimension_sections [-4, 2, 2, 0]", ">= 0")),
    # the int sum of ggml's sections overflows to -2
    "rope-sections-sum-overflows": (dict(rope_sections=(2**31 - 1, 2**31 - 1, 0, 0)), ML,
                                    ("dflash.rope.dimension_sections [2147483647, 2147483647, 0, 0]",)),
}


@pytest.fixture(scope="module")
def dflash_outcomes(tmp_path_factory, target_path):
    d = tmp_path_factory.mktemp("bad-dflash")
    paths = {name: str(bad_drafter(d / f"{name}.gguf", **kw)) for name, (kw, _, _) in DFLASH_CASES.items()}
    # as the drafter only, and a drafter that loads also drafts (some bad values crash only in a decode)
    worker = WORKER.replace('for role in ("target", "drafter")', 'for role in ("drafter",)').replace(
        "Llama(good, draft=path, n_ctx=64).close()",
        "Llama(good, draft=path, n_ctx=64).generate('ab', max_tokens=4, ignore_eos=True)")
    assert "generate(" in worker
    results: dict = {}
    crashes: list[str] = []
    for name, path in paths.items():  # one process per file: a crash names its case
        proc = subprocess.run([sys.executable, "-c", worker, str(target_path), path],
                              capture_output=True, text=True, timeout=300)
        line = proc.stdout.splitlines()[-1] if proc.stdout else ""
        if proc.returncode != 0:
            crashes.append(f"{name} (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
        elif line.startswith("REFUSED"):
            parts = line.split(" ", 4)
            results[name] = (parts[3], json.loads(parts[4]))
        else:
            results[name] = line
    return results, crashes


def test_dflash_specific_malformed_drafters_get_their_own_error(dflash_outcomes):
    results, crashes = dflash_outcomes
    assert not crashes, "\n".join(crashes)
    bad = []
    for name, (_, exc, fragments) in DFLASH_CASES.items():
        got = results.get(name)
        if not isinstance(got, tuple) or got[0] != exc or not all(f in got[1] for f in fragments):
            bad.append(f"{name}: expected {exc} with {fragments}, got {got}")
    assert not bad, "\n".join(bad)


def test_a_duplicated_target_layer_is_a_valid_drafter(tmp_path, target_path):
    # fc.weight is sized for the listed layers, so [1, 1] is consistent: it
    # loads, reads layer 1's features twice and stays lossless
    from pydflash import Llama

    p = bad_drafter(tmp_path / "dup.gguf", target_layers=(1, 1))
    with Llama(target_path, draft=p, n_ctx=256) as llm:
        assert llm.pair.target_layer_ids == [1, 1]
        spec = llm.generate("def f():", max_tokens=24, ignore_eos=True, draft_max=llm.pair.max_draft)
        assert spec.tokens == llm.generate("def f():", max_tokens=24, ignore_eos=True, draft_max=0).tokens
        assert spec.stats.n_drafted > 0


HYBRID_WORKER = r"""
import json, sys
from pydflash import Llama, ModelLoadError
try:
    with Llama(sys.argv[1], n_ctx=64) as llm:
        llm.generate("ab", max_tokens=4, ignore_eos=True)
    print("LOADED")
except ModelLoadError as e:
    print("REFUSED", json.dumps(str(e)))
"""


@pytest.mark.parametrize("sections", [(0, 0, 0, 0), (9, 0, 0, 0), (-2, 6, 2, 0)], ids=["zero", "past-n-rot", "negative"])
def test_a_hybrid_target_with_bad_rope_sections_is_refused(tmp_path, sections):
    # an IMRoPE target (qwen35, n_rot 16) whose sections would make ggml's rope
    # kernel divide by zero or assert, in the first decode (found with the
    # DFlash cases above); 9 pairs exceed n_rot / 2 = 8 but not n_rot: allowed
    # by the kernel, so only past n_rot = 16 is refused
    p = gguf_writers.write_hybrid_target(tmp_path / "t.gguf", gguf_writers.HybridSpec(rope_sections=(0, 0, 0, 0)))
    raw = p.read_bytes()
    old = struct.pack("<4i", 0, 0, 0, 0)
    # patch the sections array in place (its four int32 follow the key, type and count)
    key = b"qwen35.rope.dimension_sections"
    at = raw.index(key) + len(key) + 4 + 4 + 8
    assert raw[at:at + 16] == old
    p.write_bytes(raw[:at] + struct.pack("<4i", *sections) + raw[at + 16:])
    proc = subprocess.run([sys.executable, "-c", HYBRID_WORKER, str(p)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if sections == (9, 0, 0, 0):
        assert proc.stdout.strip() == "LOADED"
        return
    word, msg = proc.stdout.strip().split(" ", 1)
    assert word == "REFUSED"
    assert f"qwen35.rope.dimension_sections [{', '.join(map(str, sections))}] is invalid" in json.loads(msg)
