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


def flag(name: str, help: str, **argparse: Any) -> dict[str, Any]:
    """A field's command-line flag, help and further argparse settings (its metadata)."""
    return {"flag": name, "help": help, **argparse}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Options of ``train_drafter`` (and of ``pydflash train-drafter``, flag for flag)."""

    target: Path = dataclasses.field(metadata=flag("-m", "the target model (GGUF) the drafter is for", required=True))
    output: Path = dataclasses.field(
        metadata=flag("-o", "where the drafter GGUF is written (the best by online tau)", required=True)
    )
    prompts: Path | None = dataclasses.field(
        default=None,
        metadata=flag(
            "--prompts",
            "prompts: plain text (one per line), JSONL with OpenAI 'messages', or JSONL with 'prompt'; "
            "default: the target writes its own",
        ),
    )
    time_budget: float | None = dataclasses.field(
        default=None,
        metadata=flag("--time-budget", "minutes for the whole run (data, training, checks)", metavar="MINUTES"),
    )
    resume: bool = dataclasses.field(
        default=False, metadata=flag("--resume", "continue the run that writes --output where it stopped")
    )
    init: Path | None = dataclasses.field(
        default=None, metadata=flag("--init", "start from this dflash drafter (GGUF), e.g. a published one")
    )
    device: str = dataclasses.field(
        default="cpu",
        metadata=flag(
            "--device", "where torch trains (with cuda the target runs on the GPU too)", choices=("cpu", "cuda")
        ),
    )
    steps: int | None = dataclasses.field(
        default=None, metadata=flag("--steps", "optimizer steps (default: what the time budget fits, else 3 epochs)")
    )
    layers: int | None = dataclasses.field(
        default=None, metadata=flag("--layers", "drafter layers (default: from the target's depth, 1 to 5)")
    )
    block_size: int = dataclasses.field(
        default=8, metadata=flag("--block-size", "the drafter's block: it drafts up to block size - 1 tokens")
    )
    taps: int | None = dataclasses.field(
        default=None, metadata=flag("--taps", "target layers the drafter reads (default: one per layer, 3 to 5)")
    )
    draft_vocab: int | None = dataclasses.field(
        default=None,
        metadata=flag(
            "--draft-vocab",
            "tokens the drafter can propose (its own head, llama.cpp's d2t), the replies' commonest; 0: the whole "
            "vocabulary; default: 8192 when the vocabulary is larger than 16384, else all",
        ),
    )
    max_prompts: int = dataclasses.field(default=4096, metadata=flag("--max-prompts", "training prompts at most"))
    max_prompt_tokens: int = dataclasses.field(
        default=1024, metadata=flag("--max-prompt-tokens", "longer prompts are left out")
    )
    max_response: int = dataclasses.field(
        default=256, metadata=flag("--max-response", "tokens of the target's reply per prompt")
    )
    eval_prompts: int = dataclasses.field(
        default=16, metadata=flag("--eval-prompts", "held-out prompts for the online tau")
    )
    eval_tokens: int = dataclasses.field(
        default=64, metadata=flag("--eval-tokens", "tokens generated per held-out prompt")
    )
    eval_every: int | None = dataclasses.field(
        default=None, metadata=flag("--eval-every", "steps between online tau checks (default: 10 per run)")
    )
    draft_max: int = dataclasses.field(default=7, metadata=flag("--draft-max", "draft length of the online tau check"))
    lr: float = dataclasses.field(default=2e-3, metadata=flag("--lr", "peak learning rate (AdamW, warmup then cosine)"))
    anchors: int = dataclasses.field(default=16, metadata=flag("--anchors", "blocks per sequence per step"))
    batch_tokens: int = dataclasses.field(default=1024, metadata=flag("--batch-tokens", "sequence tokens per step"))
    thinking: bool = dataclasses.field(
        default=True,
        metadata=flag("--no-thinking", "render chats with thinking off (as you serve them)", action="store_false"),
    )
    n_parallel: int | None = dataclasses.field(
        default=None,
        metadata=flag(
            "--parallel",
            "replies the target generates at once (default: 16, or 8 for a target of 2B parameters or more, "
            "whose KV cache per sequence is larger)",
        ),
    )
    threads: int | None = dataclasses.field(
        default=None, metadata=flag("--threads", "CPU threads (torch and llama.cpp; default: all cores)")
    )
    seed: int = dataclasses.field(
        default=0, metadata=flag("--seed", "seed of the prompts, batches and initial weights")
    )
    cache_dir: Path = dataclasses.field(
        default_factory=default_cache_dir,
        metadata=flag(
            "--cache-dir", "where data, features and checkpoints are kept (default: ~/.cache/pydflash/train)"
        ),
    )
    progress: bool = dataclasses.field(
        default=True, metadata=flag("--no-progress", "no progress bar", action="store_false")
    )

    def __post_init__(self) -> None:
        for name in ("steps", "layers", "taps", "eval_every", "threads", "n_parallel"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise TrainingInputError(f"{name} must be a positive int or None, not {v!r}")
        positive = ("max_prompts", "max_prompt_tokens", "max_response", "eval_prompts", "eval_tokens", "draft_max",
                    "anchors", "batch_tokens")  # fmt: skip
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
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise TrainingInputError(
                f"seed must be an int >= 0 (a run is reproducible and resumable), not {self.seed!r}"
            )
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
