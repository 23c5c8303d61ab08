"""A prefill long enough to interrupt on this machine: sized from the measured prefill
rate (tests/test_reliability.py; its subprocesses import this module too)."""

from __future__ import annotations

TIMER = 0.05  # seconds until the interrupt
MIN_PREFILL = 1.0  # seconds the prefill to interrupt must last at least (20x the timer)
PROBE = 2048  # prompt tokens of the rate measurement


def long_prompt(n: int) -> list[int]:
    return [(i * 7919) % 380 for i in range(n)]


def tokens_for(seconds: float, rate: float) -> int:
    """Prompt tokens whose prefill lasts ``seconds`` at ``rate`` tokens/s (a
    lower bound: attention makes longer prompts slower per token)."""
    return int(min(max(rate * seconds, 4096), 2**18))
