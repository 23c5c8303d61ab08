"""The lossless suite's prompts (tests/test_lossless.py, the hybrid targets' suite and
the draft-length tests) and its check of a result's step statistics."""

from __future__ import annotations

import pytest

TEXT_PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n",
    "class Stack:\n    def __init__(self):",
    "The quick brown fox",
    "for i in range(10):\n    print(i)",
    "x",
    "Speculative decoding keeps the output of the target",
    "return result",
    "    if value is not None and index % 2 == 0:",
    "hello world " * 12,
    "{\"key\": [1, 2, 3], \"other\": null}",
    "über naïve café — ünïcödé",
]  # fmt: skip
# raw token-id prompts, spread over the vocabulary (ids < 256 are byte tokens)
ID_PROMPTS = [
    [7],
    [1, 2, 3, 4, 5],
    [300, 12, 99, 250, 17, 45],
    list(range(40, 120)),
    [381, 380, 379],
    [200] * 30,
    [65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76],
    [270, 11, 270, 11, 270, 11],
]
PROMPTS = [pytest.param(p, id=f"text{i}") for i, p in enumerate(TEXT_PROMPTS)] + [
    pytest.param(p, id=f"ids{i}") for i, p in enumerate(ID_PROMPTS)
]
N_TOKENS = 128


def check_stats(res, draft_max: int) -> None:
    steps = res.stats.steps
    assert res.stats.n_steps == len(steps) > 0
    for s in steps:
        assert 0 <= s.n_accepted <= s.n_drafted <= draft_max
        assert len(s.tokens) == s.n_accepted + 1
        assert list(s.tokens[:-1]) == list(s.drafted[: s.n_accepted])
    produced = sum(s.n_accepted + 1 for s in steps)
    # the last step may be cut by max_tokens
    assert produced - len(steps[-1].tokens) < len(res.tokens) <= produced
    assert res.stats.n_drafted == sum(s.n_drafted for s in steps)
    assert res.stats.n_accepted == sum(s.n_accepted for s in steps)
    assert res.stats.mean_accepted_length == pytest.approx(len(res.tokens) / res.stats.n_steps)
