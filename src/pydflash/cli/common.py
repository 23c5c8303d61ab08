"""Options and output shared by the ``pydflash`` commands."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from .. import _core
from ..config import CACHE_TYPES, FLASH_ATTN, SPEC_TYPES, SPLIT_MODES, ModelConfig, NgramConfig
from ..results import GenerationResult

DRAFT_MAX_HELP = (
    "draft tokens per step, pinned (default: chosen each step from the measured pass costs and the running "
    "acceptance, 0 to block size - 1; see --no-draft-adaptive)"
)


def add_common(p: argparse.ArgumentParser) -> None:
    d = ModelConfig()  # the core's defaults
    _add_load(p, d)
    p.add_argument(
        "--no-draft-adaptive",
        action="store_true",
        help="without --draft-max, draft block size - 1 tokens every step (the fixed length) instead of "
        "choosing each step's length",
    )
    p.add_argument(
        "--draft-window",
        type=int,
        default=None,
        metavar="N",
        help="the drafter sees the target features of the last N positions only (flat drafter memory as the "
        "context grows); 0: the whole context (default: the drafter's own sliding window, else "
        f"{_core.DEFAULT_DRAFT_WINDOW})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="show llama.cpp's log")
    dev = p.add_argument_group("devices and KV cache (as llama.cpp's options of the same names)")
    dev.add_argument(
        "-ngl",
        "--n-gpu-layers",
        type=int,
        default=d.n_gpu_layers,
        help="target layers to offload; -1 = all (default: %(default)s)",
    )
    dev.add_argument(
        "-ngld",
        "--draft-n-gpu-layers",
        type=int,
        default=None,
        help="drafter layers to offload (default: as --n-gpu-layers)",
    )
    dev.add_argument(
        "-sm",
        "--split-mode",
        choices=SPLIT_MODES,
        default=d.split_mode,
        help="how layers spread over several GPUs (default: %(default)s)",
    )
    dev.add_argument("-mg", "--main-gpu", type=int, default=d.main_gpu, help="the GPU used with --split-mode none")
    dev.add_argument(
        "-ts",
        "--tensor-split",
        type=lambda t: tuple(float(x) for x in t.split(",")),
        default=(),
        metavar="SHARES",
        help="share of the model per GPU, e.g. 3,1 (default: by free memory)",
    )
    dev.add_argument(
        "--rpc",
        default="",
        metavar="SERVERS",
        help="host:port of RPC servers, comma-separated (see `pydflash rpc-server`)",
    )
    dev.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN, default=d.flash_attn, help="(default: %(default)s)")
    dev.add_argument(
        "-nkvo", "--no-kv-offload", action="store_true", help="keep the KV caches in host memory, not on the GPU"
    )
    dev.add_argument("-ctk", "--cache-type-k", choices=CACHE_TYPES, default=d.type_k, help="target K cache type")
    dev.add_argument(
        "-ctv",
        "--cache-type-v",
        choices=CACHE_TYPES,
        default=d.type_v,
        help="target V cache type (quantized needs flash attention)",
    )
    dev.add_argument(
        "-ctkd", "--cache-type-k-draft", choices=CACHE_TYPES, default=d.draft_type_k, help="drafter K cache type"
    )
    dev.add_argument(
        "-ctvd", "--cache-type-v-draft", choices=CACHE_TYPES, default=d.draft_type_v, help="drafter V cache type"
    )

    add_speculative(p)


def _add_load(p: argparse.ArgumentParser, d: ModelConfig) -> None:
    """Context, threads, batches and how the weights load: llama.cpp's flags of the same names."""
    p.add_argument(
        "-c",
        "--ctx-size",
        "--n-ctx",
        dest="n_ctx",
        type=int,
        default=d.n_ctx,
        help="context size in tokens, shared by --parallel sequences (default: %(default)s)",
    )
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads; 0 or -1: all cores (default: all)")
    p.add_argument(
        "-tb",
        "--threads-batch",
        type=int,
        default=None,
        help="CPU threads of prompt passes; 0 or -1: all cores (default: --threads)",
    )
    p.add_argument("-b", "--batch-size", type=int, default=d.n_batch, help="logical batch (default: %(default)s)")
    p.add_argument(
        "-ub", "--ubatch-size", type=int, default=None, help="physical batch (default: the smaller of 512 and -b)"
    )
    p.add_argument("--mlock", action="store_true", help="keep the weights in RAM")
    p.add_argument("--no-mmap", action="store_true", help="read the weights instead of mapping the file")
    p.add_argument("--rope-freq-base", type=float, default=0.0, help="the target's RoPE base (default: the model's)")


UNSUPPORTED = ("draft-simple", "draft-eagle3")  # refused by the core, with a reason


def add_speculative(p: argparse.ArgumentParser) -> None:
    """llama.cpp's --spec-type list and --spec-ngram-* settings, same names."""
    g = p.add_argument_group("speculative decoding (as llama.cpp's options of the same names)")
    g.add_argument(
        "--spec-type",
        default=None,
        metavar="TYPES",
        help="comma-separated list of " + ",".join(t for t in SPEC_TYPES if t not in UNSUPPORTED) + "; n-gram "
        "types draft first, the drafter "
        "otherwise, e.g. ngram-mod,draft-dflash; draft-mtp drafts with the target's own MTP head "
        "(Qwen3.5/3.6) (default: draft-dflash with -d, else none)",
    )
    for f in dataclasses.fields(NgramConfig):
        g.add_argument(
            "--spec-ngram-" + f.name.replace("_", "-"),
            type=int,
            default=f.default,
            metavar="N",
            help=f"NgramConfig.{f.name} (default: %(default)s)",
        )


def ngram_options(a: argparse.Namespace) -> NgramConfig:
    return NgramConfig(**{f.name: getattr(a, "spec_ngram_" + f.name) for f in dataclasses.fields(NgramConfig)})


def _all_cores(n: int | None) -> int | None:
    """llama.cpp's -t/-tb: 0 or below is every core (None)."""
    return None if n is None or n <= 0 else n


def llama_options(a: argparse.Namespace) -> dict[str, Any]:
    """Llama's keyword options from add_common's flags."""
    return dict(
        n_ctx=a.n_ctx,
        n_threads=_all_cores(a.threads),
        n_threads_batch=_all_cores(a.threads_batch),
        n_batch=a.batch_size,
        n_ubatch=a.ubatch_size,
        use_mlock=a.mlock,
        use_mmap=not a.no_mmap,
        rope_freq_base=a.rope_freq_base,
        draft_adaptive=not a.no_draft_adaptive,
        verbose=a.verbose,
        n_gpu_layers=a.n_gpu_layers,
        draft_n_gpu_layers=a.draft_n_gpu_layers,
        split_mode=a.split_mode,
        main_gpu=a.main_gpu,
        tensor_split=a.tensor_split,
        rpc_servers=a.rpc,
        flash_attn=a.flash_attn,
        offload_kqv=not a.no_kv_offload,
        type_k=a.cache_type_k,
        type_v=a.cache_type_v,
        draft_type_k=a.cache_type_k_draft,
        draft_type_v=a.cache_type_v_draft,
        draft_window=a.draft_window,
        speculative=a.spec_type,
        ngram=ngram_options(a),
    )


def stats_line(res: GenerationResult) -> str:
    s = res.stats
    return (
        f"tokens={s.n_tokens} steps={s.n_steps} drafted={s.n_drafted} accepted={s.n_accepted} "
        f"acceptance={s.acceptance_rate:.3f} tau={s.mean_accepted_length:.3f} "
        f"decode={s.decode_tokens_per_second:.1f} tok/s prefill={s.prefill_tokens_per_second:.1f} tok/s "
        f"finish={res.finish_reason}" + "".join(f" {k}={v.n_accepted}/{v.n_drafted}" for k, v in s.by_source.items())
    )
