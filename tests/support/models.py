"""The tiny models' specs that tests/conftest.py writes and several test files reuse."""

from __future__ import annotations

import dataclasses

from pydflash import gguf_writers

# Two drafter shapes over one target: block 8 / 1 layer / 2 target layers, and
# block 16 / 2 layers / 3 target layers with other head counts.
TARGET = gguf_writers.TargetSpec()
DRAFTERS = {
    "b8": gguf_writers.DrafterSpec(),
    "b16": gguf_writers.DrafterSpec(n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=96,
                               target_layers=(0, 2, 3), block_size=16, seed=7),
}  # fmt: skip

# Hybrid targets (tests/test_hybrid*.py): qwen35 (the Qwen3.5/3.6 layout) and
# qwen35moe targets with multi-section-RoPE drafters, and a qwen3next target
# (checkpoint rollback).
HYBRID_TARGETS = {
    "qwen35": gguf_writers.HybridSpec(),
    "qwen35moe": gguf_writers.HybridSpec(architecture="qwen35moe", seed=9),
    "qwen3next": gguf_writers.HybridSpec(architecture="qwen3next", seed=5),
}
SECTIONS = HYBRID_TARGETS["qwen35"].rope_sections
HYBRID_DRAFTERS = {
    "b8": gguf_writers.DrafterSpec(target_layers=(1, 3), rope_sections=SECTIONS),
    "b16": gguf_writers.DrafterSpec(n_layer=2, n_head=2, n_head_kv=1, head_dim=32, n_ff=96, target_layers=(0, 2, 3),
                               block_size=16, seed=7, rope_sections=(6, 5, 5, 0)),
}  # fmt: skip

# The spread pair: small head weights give flat distributions at temperature 1, so
# sampling is not greedy, each sampling field changes the output, and this random
# drafter's tokens are often accepted AND often rejected.
SPREAD = dataclasses.replace(TARGET, head_scale=0.2, hot_tokens=10, seed=5)
SPREAD_DRAFTER = gguf_writers.DrafterSpec(seed=9, attn_out_scale=1.0)
