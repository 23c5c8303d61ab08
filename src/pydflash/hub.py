"""GGUF files from the Hugging Face Hub (or its local cache) through
``huggingface_hub`` — its cache layout, offline mode (``HF_HUB_OFFLINE=1`` /
``local_files_only=True``) and progress bars. It returns paths;
``Llama.from_pretrained`` loads them."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

__all__ = ["resolve", "resolve_pair"]

_GLOB_CHARS = set("*?[")


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.errors
    except ImportError:  # pragma: no cover - an optional dependency
        raise ImportError("Llama.from_pretrained needs huggingface_hub: pip install 'pydflash[hub]'") from None
    return huggingface_hub


def resolve(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    cache_dir: os.PathLike[str] | str | None = None,
    local_files_only: bool = False,
    token: str | None = None,
) -> Path:
    """The local path of ``filename`` in ``repo_id`` (downloaded when missing).

    ``filename`` may be a glob (``"*Q4_K_M.gguf"``); it must match exactly one
    file, or the first shard of a split GGUF (``...-00001-of-000NN.gguf``)."""
    if not isinstance(repo_id, str) or not repo_id:
        raise ValueError("repo_id must be a non-empty string like 'org/name'")
    if not isinstance(filename, str) or not filename:
        raise ValueError("filename must be a non-empty string (a file name or a glob pattern)")
    hf = _hub()
    cache = os.fspath(cache_dir) if cache_dir is not None else None
    try:
        if not _GLOB_CHARS & set(filename):
            return Path(
                hf.hf_hub_download(
                    repo_id,
                    filename,
                    revision=revision,
                    cache_dir=cache,
                    local_files_only=local_files_only,
                    token=token,
                )
            )
        folder = Path(
            hf.snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                allow_patterns=[filename],
                local_files_only=local_files_only,
                token=token,
            )
        )
    except (
        hf.errors.LocalEntryNotFoundError,
        hf.errors.EntryNotFoundError,
        hf.errors.RepositoryNotFoundError,
        hf.errors.RevisionNotFoundError,
        hf.errors.OfflineModeIsEnabled,
    ) as e:
        raise ModelLoadError(
            f"{repo_id}: {filename!r} is not available"
            f"{' in the local cache' if local_files_only or _offline() else ''}: {e}"
        ) from e
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    matches = [f for f in files if fnmatch.fnmatch(f, filename)]
    if len(matches) > 1:
        shards = [m for m in matches if "-00001-of-" in m]
        if len(shards) == 1:
            matches = shards
        else:
            raise ValueError(f"{repo_id}: {filename!r} matches {len(matches)} files: {', '.join(matches)}")
    if not matches:
        raise ModelLoadError(
            f"{repo_id}: no file matches {filename!r}" + (f" (files: {', '.join(files)})" if files else "")
        )
    if "-00001-of-" in matches[0]:
        # llama.cpp loads the other shards from beside the first one
        rest = matches[0].replace("-00001-of-", "-*-of-")
        snapshot_folder = Path(
            hf.snapshot_download(
                repo_id,
                revision=revision,
                cache_dir=cache,
                allow_patterns=[rest],
                local_files_only=local_files_only,
                token=token,
            )
        )
        return snapshot_folder / matches[0]
    return folder / matches[0]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def resolve_pair(
    repo_id: str,
    filename: str | None = None,
    *,
    draft_repo_id: str | None = None,
    draft_filename: str | None = None,
    revision: str | None = None,
    draft_revision: str | None = None,
    cache_dir: os.PathLike[str] | str | None = None,
    local_files_only: bool = False,
    token: str | None = None,
) -> tuple[Path, Path | None]:
    """The local paths of a target and, optionally, a drafter: what
    ``Llama.from_pretrained(repo_id, filename, draft_repo_id=..., draft_filename=...)`` loads.

    ``filename`` / ``draft_filename`` may be globs. The drafter comes from
    ``draft_repo_id`` (default: ``repo_id``) when ``draft_filename`` is given;
    ``draft_repo_id`` alone means its only ``*.gguf``."""
    if filename is None:
        filename = "*.gguf"
    target = resolve(
        repo_id, filename, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only, token=token
    )
    draft: Path | None = None
    if draft_repo_id is not None or draft_filename is not None:
        draft = resolve(
            draft_repo_id or repo_id,
            draft_filename or "*.gguf",
            revision=draft_revision if draft_repo_id else (draft_revision or revision),
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            token=token,
        )
    return target, draft
