"""Every option of ``train_drafter`` declared once: its type, default, check and
command-line flag (``pydflash train-drafter`` builds its parser from these)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from .errors import TrainingInputError

__all__ = ["TrainConfig", "default_cache_dir"]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/pydflash/train`` (``~/.cache/pydflash/train``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pydflash" / "train"


def _opt(flag: str, help: str, **kw: Any) -> Any:
    """A field's command-line flag and help, kept beside its default."""
    default = kw.pop("default", None)
    factory = kw.pop("default_factory", None)
    meta = {"flag": flag, "help": help, **kw}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Options of ``train_drafter`` (and of ``pydflash train-drafter``, flag for flag)."""

    target: Path = _opt("-m", "the target model (GGUF) the drafter is for", required=True)
    output: Path = _opt("-o", "where the drafter GGUF is written (the best one by online tau)", required=True)
    prompts: Path | None = _opt(
        "--prompts",
        "prompts: plain text (one per line), JSONL with OpenAI 'messages', or JSONL with 'prompt'; "
        "default: the target writes its own",
    )
    time_budget: float | None = _opt(
        "--time-budget", "minutes for the whole run (data, training, checks); it ends on time", metavar="MINUTES"
    )
    resume: bool = _opt("--resume", "continue the run that writes --output where it stopped (same data, same state)")
    init: Path | None = _opt("--init", "start from this dflash drafter (GGUF), e.g. a published one to fine-tune")
    device: str = _opt("--device", "where torch trains (the target runs on the GPU too with cuda)", default="cpu",
                       choices=("cpu", "cuda"))  # fmt: skip
    steps: int | None = _opt("--steps", "optimizer steps (default: what the time budget fits, else 3 epochs)")
    layers: int | None = _opt("--layers", "drafter layers (default: from the target's depth, 1 to 5)")
    block_size: int = _opt("--block-size", "the drafter's block: it drafts up to block size - 1 tokens", default=8)
    taps: int | None = _opt("--taps", "target layers the drafter reads (default: as many as its layers, 3 to 5)")
    draft_vocab: int | None = _opt(
        "--draft-vocab",
        "tokens the drafter can propose (its own head, llama.cpp's d2t): the most frequent in the replies; "
        "0: the whole vocabulary; default: 8192 when the vocabulary is larger than 16384, else all",
    )
    max_prompts: int = _opt("--max-prompts", "training prompts at most", default=4096)
    max_prompt_tokens: int = _opt("--max-prompt-tokens", "longer prompts are left out", default=1024)
    max_response: int = _opt("--max-response", "tokens of the target's reply to each prompt", default=256)
    eval_prompts: int = _opt("--eval-prompts", "held-out prompts for the online tau", default=16)
    eval_tokens: int = _opt("--eval-tokens", "tokens generated per held-out prompt", default=64)
    eval_every: int | None = _opt("--eval-every", "steps between online tau checks (default: 10 per run)")
    draft_max: int = _opt("--draft-max", "draft length of the online tau check", default=7)
    lr: float = _opt("--lr", "peak learning rate (AdamW, warmup then cosine)", default=6e-4)
    anchors: int = _opt("--anchors", "blocks per sequence per step", default=32)
    batch_tokens: int = _opt("--batch-tokens", "sequence tokens per step", default=4096)
    thinking: bool = _opt("--no-thinking", "render chats with thinking off (as you will serve them)", default=True,
                          action="store_false")  # fmt: skip
    n_parallel: int = _opt("--parallel", "replies the target generates at once", default=8)
    threads: int | None = _opt("--threads", "CPU threads (torch and llama.cpp; default: all cores)")
    seed: int = _opt("--seed", "seed of the prompts, batches and initial weights", default=0)
    cache_dir: Path = _opt("--cache-dir", "where data, features and checkpoints are kept",
                           default_factory=default_cache_dir)  # fmt: skip
    progress: bool = _opt("--no-progress", "no progress bar", default=True, action="store_false")

    def __post_init__(self) -> None:
        for name in ("steps", "layers", "taps", "eval_every", "threads"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise TrainingInputError(f"{name} must be a positive int or None, not {v!r}")
        positive = ("max_prompts", "max_prompt_tokens", "max_response", "eval_prompts", "eval_tokens", "draft_max",
                    "anchors", "batch_tokens", "n_parallel")  # fmt: skip
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise TrainingInputError(f"{name} must be a positive int, not {v!r}")
        if self.draft_vocab is not None and (not isinstance(self.draft_vocab, int) or self.draft_vocab < 0):
            raise TrainingInputError(f"draft_vocab must be >= 0 (0: the whole vocabulary), not {self.draft_vocab!r}")
        if not 2 <= self.block_size <= 64:
            raise TrainingInputError(f"block_size must be in [2, 64], not {self.block_size}")
        if self.draft_max >= self.block_size:
            raise TrainingInputError(f"draft_max {self.draft_max} must be below block_size {self.block_size}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise TrainingInputError(f"time_budget must be > 0 minutes, not {self.time_budget}")
        if not self.lr > 0:
            raise TrainingInputError(f"lr must be > 0, not {self.lr}")
        if self.device not in ("cpu", "cuda"):
            raise TrainingInputError(f"device must be 'cpu' or 'cuda', not {self.device!r}")

    @staticmethod
    def build(target: str | os.PathLike[str], output: str | os.PathLike[str], **options: Any) -> TrainConfig:
        """A config from ``train_drafter``'s arguments (paths as str or Path); unknown keywords are a TypeError."""
        known = {f.name for f in dataclasses.fields(TrainConfig)}
        bad = sorted(set(options) - known)
        if bad:
            raise TypeError(f"train_drafter() got unexpected keyword arguments: {', '.join(bad)}")
        for name in ("prompts", "init", "cache_dir"):
            if options.get(name) is not None:
                options[name] = Path(options[name])
        return TrainConfig(target=Path(target), output=Path(output), **options)
