"""Llama.from_pretrained through the real huggingface_hub, offline, against a
hub cache this test writes in the hub's own layout (blobs, snapshots, refs)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pydflash import Llama, ModelLoadError

pytest.importorskip("huggingface_hub")

COMMIT_MAIN = "a" * 40
COMMIT_V1 = "b" * 40


def add_to_cache(cache: Path, repo_id: str, files: dict[str, Path | bytes], commit: str, ref: str = "main") -> None:
    """Store ``files`` as huggingface_hub does: content-addressed blobs, a
    snapshot folder of relative symlinks per commit, and refs/<ref> -> commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    snap = repo / "snapshots" / commit
    for name, src in files.items():
        data = src.read_bytes() if isinstance(src, Path) else src
        sha = hashlib.sha256(data).hexdigest()
        blob = repo / "blobs" / sha
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs" / ref).write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, model_dir):
    cache = tmp_path_factory.mktemp("hub") / "hub"
    add_to_cache(cache, "tiny-org/tiny-target-GGUF",
                 {"tiny-target-f32.gguf": model_dir / "target.gguf", "README.md": b"# tiny target\n"}, COMMIT_MAIN)
    add_to_cache(cache, "tiny-org/tiny-dflash-GGUF",
                 {"tiny-dflash-b8.gguf": model_dir / "drafter-b8.gguf",
                  "tiny-dflash-b16.gguf": model_dir / "drafter-b16.gguf"}, COMMIT_MAIN)
    # an older revision of the drafter repo, under the ref "v1"
    add_to_cache(cache, "tiny-org/tiny-dflash-GGUF", {"old/tiny-dflash.gguf": model_dir / "drafter-b8.gguf"},
                 COMMIT_V1, ref="v1")
    return cache


def test_from_pretrained_with_globs(hub_cache, baseline):
    with Llama.from_pretrained("tiny-org/tiny-target-GGUF", "*f32.gguf", draft_repo_id="tiny-org/tiny-dflash-GGUF",
                               draft_filename="*-b8.gguf", cache_dir=hub_cache, local_files_only=True,
                               n_ctx=256) as llm:
        assert llm.has_draft
        path = Path(llm.model_path)
        assert path.parent == hub_cache / "models--tiny-org--tiny-target-GGUF" / "snapshots" / COMMIT_MAIN
        assert path.is_symlink() and path.resolve().parent.name == "blobs"
        # whole blocks pinned: on a tiny compute-bound pair the adaptive length may draft nothing
        res = llm.generate("x = 1", max_tokens=12, ignore_eos=True, draft_max=llm.pair.max_draft)
        assert res.tokens == baseline.generate("x = 1", max_tokens=12, ignore_eos=True).tokens
        assert res.stats.n_drafted > 0


def test_exact_filename_and_revision(hub_cache):
    with Llama.from_pretrained("tiny-org/tiny-target-GGUF", "tiny-target-f32.gguf",
                               draft_repo_id="tiny-org/tiny-dflash-GGUF", draft_filename="old/*.gguf",
                               draft_revision="v1", cache_dir=hub_cache, local_files_only=True, n_ctx=256) as llm:
        assert COMMIT_V1 in llm.draft_path
        assert llm.pair.block_size == 8


def test_ambiguous_and_missing_files(hub_cache):
    kw = dict(cache_dir=hub_cache, local_files_only=True, n_ctx=256)
    with pytest.raises(ValueError, match="matches 2 files"):
        Llama.from_pretrained("tiny-org/tiny-dflash-GGUF", "*.gguf", **kw)
    with pytest.raises(ModelLoadError, match="no file matches"):
        Llama.from_pretrained("tiny-org/tiny-target-GGUF", "*Q4_K_M.gguf", **kw)
    with pytest.raises(ModelLoadError, match="not available"):
        Llama.from_pretrained("tiny-org/tiny-target-GGUF", "missing.gguf", **kw)
    with pytest.raises(ModelLoadError, match="not available"):
        Llama.from_pretrained("tiny-org/no-such-repo", "*.gguf", **kw)
    with pytest.raises(ValueError, match="repo_id"):
        Llama.from_pretrained("", "x.gguf", **kw)
    with pytest.raises(TypeError, match="draft_repo_id"):
        Llama.from_pretrained("tiny-org/tiny-target-GGUF", "*.gguf", draft="x.gguf", **kw)


def test_offline_env_and_default_cache(hub_cache, tmp_path):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE as a user sets them, no cache_dir argument."""
    code = ("from pydflash import Llama\n"
            "llm = Llama.from_pretrained('tiny-org/tiny-target-GGUF', '*.gguf', "
            "draft_repo_id='tiny-org/tiny-dflash-GGUF', draft_filename='*b16*', n_ctx=256)\n"
            "print(llm.pair.block_size, llm.generate('x', max_tokens=4, ignore_eos=True).stats.n_tokens)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "HF_HOME": str(tmp_path / "home")}
    env.pop("HF_TOKEN", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["16", "4"]
