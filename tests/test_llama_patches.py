"""pydflash's patches to the vendored llama.cpp: the model graphs that now
record layer inputs feed a DFlash drafter (lossless at temperature 0), a
drafter trained for them loads, and the patch set fails loudly on a graph
file it does not know."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from pydflash import Llama, _core, gguf_writers

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "vendor" / "llama.cpp"
_spec = importlib.util.spec_from_file_location("patch_llama_cpp", ROOT / "tools" / "patch_llama_cpp.py")
assert _spec is not None and _spec.loader is not None
patches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(patches)

TARGET = gguf_writers.TargetSpec(hot_tokens=16, head_scale=6.0, seed=4)
DRAFTER = gguf_writers.DrafterSpec(target_layers=(1, 3), attn_out_scale=1.0)
PATCHED = ("qwen2", "gemma3", "phi3", "smollm3")


def test_every_patched_graph_is_known_to_the_core():
    assert set(patches.LAYER_INPUT_GRAPHS) <= set(_core.layer_input_architectures())


@pytest.mark.skipif(not VENDOR.is_dir(), reason="no vendored llama.cpp tree (an installed wheel)")
def test_the_vendored_tree_is_patched():
    assert patches.apply(VENDOR, check_only=True) == []


def test_a_changed_upstream_file_fails_loudly(tmp_path):
    src = tmp_path / "llama.cpp"
    (src / "src" / "models").mkdir(parents=True)
    for name in patches.LAYER_INPUT_GRAPHS.values():
        (src / "src" / "models" / name).write_text("void f() {\n" + patches.LOOP + "    }\n}\n")
    changed = patches.apply(src)
    assert changed == list(patches.LAYER_INPUT_GRAPHS)
    assert patches.apply(src) == []  # idempotent
    qwen2 = src / "src" / "models" / "qwen2.cpp"
    qwen2.write_text(qwen2.read_text().replace("il < n_layer", "il < n_layer_dense"))
    with pytest.raises(patches.PatchError, match="expected one layer loop"):
        patches.apply(src)
    shutil.rmtree(src / "src" / "models")
    with pytest.raises(patches.PatchError, match="missing"):
        patches.apply(src)


@pytest.mark.parametrize("arch", PATCHED)
def test_a_patched_architecture_drafts_losslessly(tmp_path, arch):
    t = gguf_writers.write_target(tmp_path / f"{arch}.gguf", TARGET, architecture=arch)
    d = gguf_writers.write_drafter(tmp_path / f"{arch}-drafter.gguf", TARGET, DRAFTER)
    with Llama(t, n_ctx=512, n_threads=1) as alone, Llama(t, draft=d, n_ctx=512, n_threads=1) as spec:
        for prompt in ("hello world", "the quick brown fox"):
            want = alone.generate(prompt, max_tokens=40, ignore_eos=True).tokens
            for dm in (1, 3, 7):
                res = spec.generate(prompt, max_tokens=40, ignore_eos=True, draft_max=dm)
                assert res.tokens == want
                assert res.stats.n_drafted > 0


@pytest.mark.parametrize("arch", PATCHED)
def test_a_drafter_trained_for_a_patched_architecture_loads(tmp_path, arch):
    pytest.importorskip("torch", reason="the train extra (torch) is not installed")
    from pydflash.train import train_drafter

    t = gguf_writers.write_target(tmp_path / f"{arch}.gguf", TARGET, architecture=arch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"prompt number {i} about the {w}" for i, w in enumerate("abcdefgh")) + "\n")
    out = tmp_path / "drafter.gguf"
    r = train_drafter(t, out, prompts=prompts, steps=3, max_response=16, eval_prompts=2, eval_tokens=8, threads=1,
                      layers=1, taps=2, anchors=4, batch_tokens=128, progress=False, cache_dir=tmp_path / "c")  # fmt: skip
    assert r.lossless and r.steps == 3
    with Llama(t, draft=out, n_ctx=256, n_threads=1) as llm:
        assert llm.has_draft and len(llm.generate("prompt", max_tokens=8, ignore_eos=True).tokens) == 8
