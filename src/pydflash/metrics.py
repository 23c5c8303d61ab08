"""Prometheus text-format metrics of a pydflash server, with the speculative
counters llama-server's ``/metrics`` lacks: tokens drafted and accepted, the
acceptance rate, tokens per target pass, and a histogram of the accepted draft
length of every step."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .openai_types import Timings

__all__ = ["Metrics"]

PREFIX = "pydflash_"


class Metrics:
    """Thread-safe counters; ``render()`` gives the Prometheus exposition text."""

    def __init__(self, max_accepted: int = 16):
        self._lock = threading.Lock()
        self.buckets = list(range(0, max(1, max_accepted) + 1))
        self.bucket_counts = [0] * len(self.buckets)
        self.hist_count = 0
        self.hist_sum = 0
        self.counters: dict[str, float] = {
            k: 0
            for k in (
                "prompt_tokens_total",
                "prompt_seconds_total",
                "tokens_predicted_total",
                "tokens_predicted_seconds_total",
                "draft_tokens_total",
                "draft_tokens_accepted_total",
                "target_passes_total",
                "requests_cancelled_total",
                "requests_failed_total",
            )
        }
        self.requests: dict[str, int] = {}
        self.processing = 0
        self.deferred = 0

    # -- updates -------------------------------------------------------------

    def request(self, endpoint: str) -> None:
        with self._lock:
            self.requests[endpoint] = self.requests.get(endpoint, 0) + 1

    def add(self, name: str, value: float = 1) -> None:
        with self._lock:
            self.counters[name] += value

    def queue(self, deferred: int = 0, processing: int = 0) -> None:
        with self._lock:
            self.deferred += deferred
            self.processing += processing

    def generation(self, timings: Timings) -> None:
        """Count one finished generation from its response's ``timings``."""
        lengths: Sequence[int] = timings.get("accepted_lengths", []) or []
        with self._lock:
            c = self.counters
            c["prompt_tokens_total"] += int(timings["prompt_n"])
            c["prompt_seconds_total"] += float(timings["prompt_ms"]) / 1e3
            c["tokens_predicted_total"] += int(timings["predicted_n"])
            c["tokens_predicted_seconds_total"] += float(timings["predicted_ms"]) / 1e3
            c["draft_tokens_total"] += int(timings["draft_n"])
            c["draft_tokens_accepted_total"] += int(timings["draft_n_accepted"])
            c["target_passes_total"] += int(timings["n_steps"])
            for n in lengths:
                self.hist_count += 1
                self.hist_sum += n
                for i, le in enumerate(self.buckets):
                    if n <= le:
                        self.bucket_counts[i] += 1

    # -- exposition ------------------------------------------------------------

    def render(self) -> str:
        with self._lock:
            c = dict(self.counters)
            out: list[str] = []

            def metric(name: str, kind: str, help_: str, value: float) -> None:
                out.append(f"# HELP {PREFIX}{name} {help_}")
                out.append(f"# TYPE {PREFIX}{name} {kind}")
                out.append(f"{PREFIX}{name} {_num(value)}")

            out.append(f"# HELP {PREFIX}requests_total Requests per endpoint.")
            out.append(f"# TYPE {PREFIX}requests_total counter")
            for ep, n in sorted(self.requests.items()):
                out.append(f'{PREFIX}requests_total{{endpoint="{ep}"}} {n}')
            for name, help_ in _COUNTERS:
                metric(name, "counter", help_, c[name])
            metric(
                "requests_processing", "gauge", "Generations running now (at most one per model pair).", self.processing
            )
            metric("requests_deferred", "gauge", "Requests waiting for the model pair.", self.deferred)
            for name, help_, num, den in _RATIOS:
                metric(name, "gauge", help_, c[num] / c[den] if c[den] else 0.0)
            name = f"{PREFIX}accepted_length"
            out.append(f"# HELP {name} Drafted tokens accepted per speculative step.")
            out.append(f"# TYPE {name} histogram")
            for le, n in zip(self.buckets, self.bucket_counts, strict=True):
                out.append(f'{name}_bucket{{le="{le}"}} {n}')
            out.append(f'{name}_bucket{{le="+Inf"}} {self.hist_count}')
            out.append(f"{name}_sum {self.hist_sum}")
            out.append(f"{name}_count {self.hist_count}")
        return "\n".join(out) + "\n"


# counters rendered as they are: (name, help)
_COUNTERS = (
    ("requests_cancelled_total", "Generations cancelled by a client disconnect."),
    ("requests_failed_total", "Requests that ended in an error."),
    ("prompt_tokens_total", "Prompt tokens processed."),
    ("prompt_seconds_total", "Prompt processing time."),
    ("tokens_predicted_total", "Generated tokens."),
    ("tokens_predicted_seconds_total", "Generation (decode) time."),
    ("draft_tokens_total", "Tokens proposed by the DFlash drafter."),
    ("draft_tokens_accepted_total", "Drafted tokens the target accepted."),
    ("target_passes_total", "Target verification passes (speculative steps)."),
)
# gauges that are ratios of two counters since start: (name, help, numerator, denominator)
_RATIOS = (
    (
        "draft_acceptance_rate",
        "Accepted / drafted tokens since start.",
        "draft_tokens_accepted_total",
        "draft_tokens_total",
    ),
    (
        "tokens_per_target_pass",
        "Generated tokens per target pass (tau) since start.",
        "tokens_predicted_total",
        "target_passes_total",
    ),
    (
        "predicted_tokens_seconds",
        "Average generation throughput in tokens/s.",
        "tokens_predicted_total",
        "tokens_predicted_seconds_total",
    ),
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "prompt_tokens_total", "prompt_seconds_total"),
)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
