"""``train_drafter``: from the GGUF a user runs to a DFlash drafter for it.

Every input is checked before anything is written (the output path, the device,
the target's architecture, the prompts file, the chat template, an ``--init``
drafter, the disk the cache needs). Then: data (prompts, the target's own
replies, its features), training with online tau, and the best drafter by
that tau written to the output."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import _core
from ..llama import Llama
from .config import TrainConfig
from .data import CHUNK, DataPlan, Dataset, build, check_disk, default_parallel, feature_bytes
from .errors import TrainingInputError
from .evaluate import Measured, measure_tau, reference_outputs
from .loop import Checkpoint, Loop, Point, Schedule
from .progress import Progress
from .prompts import SELF_PROMPT_CTX, TrainPrompt, prompts_digest, read_prompts, user_prefix
from .report import TrainReport
from .shape import DrafterShape, default_shape, draft_vocab, shape_of_drafter
from .target import TargetInfo, frozen_tensors, read_target, read_tensors

__all__ = ["train_drafter"]

_DATA_SHARE = 0.4  # of a time budget, at most, for making data (cached data costs nothing)


def train_drafter(target: str | os.PathLike[str], output: str | os.PathLike[str], **options: Any) -> TrainReport:
    """Train a DFlash drafter for the GGUF ``target`` and write it to ``output`` (a GGUF in
    upstream llama.cpp's ``dflash`` layout). Options: ``TrainConfig``'s fields (``prompts``,
    ``time_budget`` in minutes, ``resume``, ``init``, ``device``, ``steps``, ...).

    Raises before writing anything: ``ModelLoadError`` (the target does not load),
    ``DraftCompatibilityError`` (an architecture without layer inputs, an ``init`` drafter
    that does not fit), ``PromptsFileError`` (with the line), ``ChatTemplateError``,
    ``TrainingInputError`` (output path, device, disk, options)."""
    cfg = TrainConfig.build(target, output, **options)
    t0 = time.monotonic()
    deadline = None if cfg.time_budget is None else t0 + cfg.time_budget * 60
    _torch(cfg)
    info = read_target(cfg.target)
    _check_output(cfg.output)
    init_shape = shape_of_drafter(cfg.init, info, block_size=cfg.block_size) if cfg.init is not None else None
    out_key = hashlib.sha256(str(cfg.output.resolve()).encode()).hexdigest()[:16]
    run_dir = cfg.cache_dir / info.fingerprint / "runs" / out_key
    ck_path = run_dir / "checkpoint.pt"
    if cfg.resume and not ck_path.exists():
        raise TrainingInputError(f"--resume: no run to continue for {cfg.output} (looked in {run_dir})")
    prog = Progress(cfg.progress)
    data_deadline = None if cfg.time_budget is None else t0 + cfg.time_budget * 60 * _DATA_SHARE
    shape0 = init_shape or default_shape(
        info, mask_token=0, n_layer=cfg.layers, block_size=cfg.block_size, n_taps=cfg.taps
    )
    plan, ds, held = _data(cfg, info, shape0, prog, data_deadline)
    ck = Checkpoint.load(ck_path) if cfg.resume else Checkpoint()
    shape = _final_shape(cfg, shape0, info, ds, ck, init_shape is not None)
    if ck.meta and ck.meta != _meta(cfg, plan, shape, len(ds.chunks)):
        raise TrainingInputError(f"--resume: the run in {run_dir} used other data, options or drafter shape")
    embd, head = frozen_tensors(cfg.target)
    model = _model(shape, embd, head, ds, cfg, ck)
    run_dir.mkdir(parents=True, exist_ok=True)
    current = run_dir / "current.gguf"
    if not ck.reference:
        ck.reference = reference_outputs(info.path, held, max_tokens=cfg.eval_tokens, n_threads=cfg.threads or 0,
                                         n_gpu_layers=_gpu_layers(cfg))  # fmt: skip
    measure = _measurer(cfg, info, shape, model, held, ck.reference, current)
    n_seqs = max(1, min(len(ds), cfg.batch_tokens // max(1, ds.n_tokens // max(1, len(ds)))))
    step_s = _probe_seconds(model, ds, shape, cfg, n_seqs)
    if not ck.meta:
        ck.meta = _meta(cfg, plan, shape, len(ds.chunks))
        t = time.monotonic()
        first = measure()  # the start's tau: the curve's first point, and what one measurement costs
        ck.eval_seconds = time.monotonic() - t
        ck.points.append(Point(0, 0.0, first.tau, first.acceptance, first.lossless, float("nan")))
        ck.best_tau = first.tau
        _keep(current, cfg.output)
    sched = _schedule(cfg, ck, ds, n_seqs, step_s, deadline)
    ck.total = sched.total
    prog.start_training(sched.total, ck.step)
    loop = Loop(model, ds, sched, ck, ck_path, measure=lambda: _measured(measure, prog),
                keep=lambda: _keep(current, cfg.output), on_step=prog.step)  # fmt: skip
    try:
        loop.run(deadline, eval_reserve=ck.eval_seconds * 1.2)
    except KeyboardInterrupt:
        loop.save()
        raise
    finally:
        prog.close()
    report = TrainReport.of(cfg, info, shape, ds, ck, time.monotonic() - t0)
    (run_dir / "report.json").write_text(json.dumps(report.to_json(), indent=1))
    return report


def _data(
    cfg: TrainConfig, info: TargetInfo, shape0: DrafterShape, prog: Progress, deadline: float | None
) -> tuple[DataPlan, Dataset, Any]:
    """The plan (prompts checked), then the data: cached chunks and, until ``deadline``, new ones."""
    gpu_layers = _gpu_layers(cfg)
    n_par = cfg.n_parallel or default_parallel(info)
    per_seq = min(cfg.max_prompt_tokens + cfg.max_response + 8, info.n_ctx_train)
    # the replies come from the capture's context; this one renders prompts and writes its own
    with Llama(
        str(cfg.target), n_ctx=n_par * min(per_seq, SELF_PROMPT_CTX), n_parallel=n_par,
        n_threads=cfg.threads, n_gpu_layers=gpu_layers,
    ) as llm:  # fmt: skip
        plan = _plan(cfg, llm)
        ds = Dataset(cfg.cache_dir / info.fingerprint / f"data-{plan.key}", shape0.target_layers)
        width = len(shape0.target_layers) * info.n_embd
        expected = cfg.max_response + min(cfg.max_prompt_tokens, 256)  # a prompt's tokens, guessed
        check_disk(ds.root, feature_bytes((cfg.max_prompts + cfg.eval_prompts) * expected, width), "the feature cache")
        capture = _core.FeatureCapture(
            llm.core_model, list(shape0.target_layers), per_seq, 512, cfg.threads or 0, n_par
        )
        prog.data(0, 0)  # the bar shows from the start: the held-out chunk comes first
        try:
            held = build(ds, plan, llm, capture, max_chunks=-(-cfg.max_prompts // CHUNK), deadline=deadline,
                         on_chunk=prog.data)  # fmt: skip
        finally:
            prog.close()
            del capture
    return plan, ds, held


def _torch(cfg: TrainConfig) -> Any:
    """torch, configured; refused clearly when it is missing or lacks the device."""
    try:
        import torch
    except ImportError:
        raise TrainingInputError("training needs torch: pip install 'pydflash[train]'") from None
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise TrainingInputError(
            "--device cuda: this torch build has no CUDA device (torch.cuda.is_available() is False)"
        )
    if cfg.device == "cuda" and not any(b.startswith(("CUDA", "cuda")) for b in _backends()):
        raise TrainingInputError("--device cuda: this pydflash build has no CUDA backend (PYDFLASH_CUDA=1 pip install)")
    torch.set_num_threads(cfg.threads or max(1, os.cpu_count() or 1))
    torch.manual_seed(cfg.seed)
    return torch


def _backends() -> list[str]:
    from ..devices import backends

    return [str(b) for b in backends()]


def _check_output(out: Path) -> None:
    """The output must be a writable file path; refused (nothing written) otherwise."""
    if out.is_dir():
        raise TrainingInputError(f"output {out} is a folder; give a file path such as {out / 'drafter.gguf'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise TrainingInputError(f"output folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise TrainingInputError(f"output {out} cannot be written (permission denied)")


def _plan(cfg: TrainConfig, llm: Llama) -> DataPlan:
    """Where prompts come from, checked up front: the file parses, the template renders."""
    chat = not llm.chat_template.is_fallback
    if chat:
        user_prefix(llm, thinking=cfg.thinking)  # a template that does not render fails here
    prompts: list[TrainPrompt] | None = None
    held: list[TrainPrompt] | None = None
    if cfg.prompts is not None:
        got = read_prompts(cfg.prompts, chat=chat)
        if len(got) < 2:
            raise TrainingInputError(f"{cfg.prompts}: at least 2 prompts are needed (some are held out for tau)")
        n_held = max(1, min(cfg.eval_prompts, len(got) // 5))
        prompts, held = got[:-n_held], got[-n_held:]
    source = "self" if prompts is None else prompts_digest([*prompts, *(held or [])])
    key_src = [source, cfg.seed, chat, cfg.thinking, cfg.max_response, cfg.max_prompt_tokens, cfg.eval_prompts, CHUNK]
    key = hashlib.sha256(json.dumps(key_src).encode()).hexdigest()[:16]
    return DataPlan(prompts, held, cfg.seed, chat, cfg.thinking, cfg.max_response, cfg.max_prompt_tokens,
                    cfg.eval_prompts, key)  # fmt: skip


def _final_shape(
    cfg: TrainConfig, s: DrafterShape, info: TargetInfo, ds: Dataset, ck: Checkpoint, from_init: bool
) -> DrafterShape:
    """The shape with its mask token and draft vocabulary: the init drafter's, the resumed run's, or
    chosen now from the data (a spare mask token no sequence contains; the replies' commonest tokens)."""
    if from_init:
        return s
    if ck.meta:
        return dataclasses.replace(s, mask_token=int(ck.meta["mask_token"]), d2t=tuple(ck.meta["d2t"]))
    flat = np.concatenate([c.tokens for c in ds.chunks])
    used = frozenset(int(t) for t in np.unique(flat))
    size = cfg.draft_vocab if cfg.draft_vocab is not None else (8192 if info.n_vocab > 16384 else 0)
    d2t: tuple[int, ...] = ()
    if 0 < size < info.n_vocab:
        replies = np.concatenate([c.sequence(i)[int(c.prompt_lens[i]) :] for c in ds.chunks for i in range(len(c))])
        ids, n = np.unique(replies, return_counts=True)
        d2t = draft_vocab(dict(zip(ids.tolist(), n.tolist(), strict=False)), info.n_vocab, size, info.eog_ids)
    return dataclasses.replace(s, mask_token=info.mask_token(used), d2t=d2t)


def _meta(cfg: TrainConfig, plan: DataPlan, s: DrafterShape, n_chunks: int) -> dict[str, Any]:
    """What a resumed run must share with the one it continues."""
    shape = {**dataclasses.asdict(s), "target_layers": list(s.target_layers), "d2t": list(s.d2t)}
    batch = {k: getattr(cfg, k) for k in ("anchors", "batch_tokens", "lr", "seed", "steps", "draft_vocab")}
    return {"data": plan.key, "chunks": n_chunks, **shape, **batch}


def _model(s: DrafterShape, embd: Any, head: Any, ds: Dataset, cfg: TrainConfig, ck: Checkpoint) -> Any:
    import torch

    from .model import Drafter

    model = Drafter(s, embd, head)
    model.feat_scale.copy_(torch.from_numpy(ds.feature_spread()))  # before any weights are loaded
    if ck.model is not None:
        model.load_state_dict(ck.model)
    elif cfg.init is not None:
        model.load_gguf_tensors(read_tensors(cfg.init))
    return model.to(cfg.device)


def _gpu_layers(cfg: TrainConfig) -> int:
    return -1 if cfg.device == "cuda" else 0


def _measurer(
    cfg: TrainConfig, info: TargetInfo, s: DrafterShape, model: Any, held: Any, ref: list[list[int]], current: Path
) -> Any:
    from .export import write_drafter_gguf

    def measure() -> Measured:
        write_drafter_gguf(current, s, info, model.gguf_tensors(), name="DFlash drafter (pydflash train-drafter)")
        return measure_tau(info.path, current, held, ref, draft_max=cfg.draft_max, n_threads=cfg.threads or 0,
                           n_gpu_layers=_gpu_layers(cfg))  # fmt: skip

    return measure


def _measured(measure: Any, prog: Progress) -> Measured:
    m: Measured = measure()
    prog.tau(m.tau)
    return m


def _keep(current: Path, out: Path) -> None:
    """The measured drafter becomes the output (copied beside it, then renamed over it)."""
    tmp = out.with_name(f".{out.name}.partial")
    shutil.copyfile(current, tmp)
    os.replace(tmp, out)


def _probe_seconds(model: Any, ds: Dataset, s: DrafterShape, cfg: TrainConfig, n_seqs: int) -> float:
    """Seconds per training step, timed on two forward/backward passes that change nothing."""
    from .objective import block_loss, draw_batch, slot_weights

    w = slot_weights(s.block_size)
    items = ds.items()
    times = []
    for k in range(2):
        b = draw_batch(ds, items, cfg.seed + 7919, k, n_seqs=n_seqs, n_anchors=cfg.anchors, block=s.block_size,
                       device=cfg.device)  # fmt: skip
        t = time.monotonic()
        loss, _ = block_loss(model, b, w, s.mask_token)
        loss.backward()  # type: ignore[no-untyped-call]
        times.append(time.monotonic() - t)
    model.zero_grad(set_to_none=True)
    return min(times)


def _schedule(
    cfg: TrainConfig, ck: Checkpoint, ds: Dataset, n_seqs: int, step_s: float, deadline: float | None
) -> Schedule:
    """Total steps (``steps``, a resumed run's, what the budget fits, or 3 epochs) and the spacing of
    the online measurements: 10 in a run, fewer where they would take over 15% of a budget's time."""
    n_evals = 10
    if ck.total:
        total = ck.total
    elif cfg.steps is not None:
        total = cfg.steps
    elif deadline is not None:
        left = max(0.0, deadline - time.monotonic()) * 0.95 - ck.eval_seconds  # the last measurement's
        n_evals = int(min(10, max(2, 0.15 * left / max(ck.eval_seconds, 1e-6))))
        total = max(1, int((left - n_evals * ck.eval_seconds) / max(step_s, 1e-6)))
    else:
        total = max(1, math.ceil(3 * len(ds) / n_seqs))
    every = cfg.eval_every or ck.eval_every or max(1, total // n_evals)
    ck.eval_every = every
    return Schedule(total, every, max(1, min(every, 50)), n_seqs, cfg.anchors, cfg.lr, cfg.seed, cfg.device)
