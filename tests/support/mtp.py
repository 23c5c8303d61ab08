"""The MTP test target (tests/test_mtp.py): a tiny qwen35 trunk whose head copies the
target's hidden state, so drafts are accepted often enough for partial acceptance."""

from __future__ import annotations

from pydflash import testing
from pydflash.testing.mtp import MtpSpec

SPEC = testing.HybridSpec(embd_common=3.0)
HEAD = MtpSpec(copy=4.0, block_scale=0.1)
