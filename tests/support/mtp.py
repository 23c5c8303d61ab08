"""The MTP test target (tests/test_mtp.py): a tiny qwen35 trunk whose head copies the
target's hidden state, so drafts are accepted often enough for partial acceptance."""

from __future__ import annotations

from pydflash import gguf_writers
from pydflash.gguf_writers.mtp import MtpSpec

SPEC = gguf_writers.HybridSpec(embd_common=3.0)
HEAD = MtpSpec(copy=4.0, block_scale=0.1)
