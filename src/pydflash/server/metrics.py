"""Prometheus metrics of a pydflash server (``prometheus_client``, one registry
per server): llama-server's ``llamacpp:`` metrics under its names, and the
speculative counters llama-server's ``/metrics`` lacks:
tokens drafted and accepted, the acceptance rate, tokens per target pass, and a
histogram of the accepted draft length of every step. Also the request queue:
requests in flight, waiting (the queue depth) and generating, and prompt-cache
hits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..results import SpeculativeStats, Timings

__all__ = ["Metrics"]

PREFIX = "pydflash_"

# llama-server's metrics: (name, type, help, how to read it from the sums); written as
# llama-server writes them (a counter's TYPE line names it with _total), which
# prometheus_client's naming rules do not allow
_LLAMACPP = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", "prompt_n"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens taken from the cache.", "cache_n"),
    ("prompt_seconds_total", "counter", "Prompt process time", "prompt_s"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed.", "predicted_n"),
    ("tokens_predicted_seconds_total", "counter", "Predict process time", "predicted_s"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls", "n_decode"),
    ("n_tokens_max", "counter", "Largest observed n_tokens.", "n_tokens_max"),
    ("spec_decode_num_draft_tokens_total", "counter", "Number of speculative draft tokens.", "draft_n"),
    ("spec_decode_num_accepted_tokens_total", "counter", "Number of accepted speculative tokens.", "draft_n_accepted"),
    ("spec_decode_num_drafts_total", "counter", "Number of speculative drafts.", "n_drafts"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", "prompt_tps"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", "predicted_tps"),
    ("requests_processing", "gauge", "Number of requests processing.", "processing"),
    ("requests_deferred", "gauge", "Number of requests deferred.", "deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call", "busy_per_decode"),
)

# counters of finished generations: (name, help, the Timings field summed, its scale)
_GENERATION_COUNTERS = (
    ("prompt_tokens_total", "Prompt tokens processed.", "prompt_n", 1.0),
    ("prompt_seconds_total", "Prompt processing time.", "prompt_ms", 1e-3),
    (
        "prompt_tokens_cached_total",
        "Prompt tokens taken from the prompt cache (llama-server's cache_n).",
        "cache_n",
        1.0,
    ),
    ("tokens_predicted_total", "Generated tokens.", "predicted_n", 1.0),
    ("tokens_predicted_seconds_total", "Generation (decode) time.", "predicted_ms", 1e-3),
    ("draft_tokens_total", "Tokens proposed by the DFlash drafter.", "draft_n", 1.0),
    ("draft_tokens_accepted_total", "Drafted tokens the target accepted.", "draft_n_accepted", 1.0),
    ("target_passes_total", "Target verification passes (speculative steps).", "n_steps", 1.0),
)
# gauges that are ratios of two of those counters since start: (name, help, numerator, denominator)
_RATIOS = (
    ("draft_acceptance_rate", "Accepted / drafted tokens since start.", "draft_n_accepted", "draft_n"),
    ("tokens_per_target_pass", "Generated tokens per target pass (tau) since start.", "predicted_n", "n_steps"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s.", "predicted_n", "predicted_ms"),
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s.", "prompt_n", "prompt_ms"),
)
_MS = {"predicted_ms", "prompt_ms"}  # denominators in ms: the ratios are per second


class Metrics:
    """Thread-safe; ``render()`` gives the Prometheus exposition text. ``slots``:
    the generations the model runs at once (the server's ``parallel``)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, max_accepted: int = 16, slots: int = 1):
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._sums: dict[str, float] = {field: 0.0 for _, _, field, _ in _GENERATION_COUNTERS}
        self._sums.update(n_drafts=0.0, n_decode=0.0, n_tokens_max=0.0)
        self._in_flight = 0
        self._processing = 0
        reg = self.registry
        self._requests = Counter(PREFIX + "requests_total", "Requests per endpoint.", ["endpoint"], registry=reg)
        self._counters = [
            (field, scale, Counter(PREFIX + name, help_, registry=reg))
            for name, help_, field, scale in _GENERATION_COUNTERS
        ]
        self._events = {
            name: Counter(PREFIX + name + "_total", help_, registry=reg)
            for name, help_ in (
                ("requests_cancelled", "Generations cancelled by a client disconnect."),
                ("requests_failed", "Requests that ended in an error."),
                ("requests_rejected", "Requests refused with 503 because the queue was full."),
                ("prompt_cache_hits", "Generations that took at least one prompt token from the prompt cache."),
            )
        }
        self._by_source = {
            field: Counter(PREFIX + name, help_, ["source"], registry=reg)
            for field, name, help_ in (
                ("draft_n", "draft_tokens_by_source_total", "Drafted tokens per draft source (--spec-type name)."),
                ("draft_n_accepted", "draft_tokens_accepted_by_source_total", "Accepted drafted tokens per source."),
            )
        }
        self._accepted = Histogram(
            PREFIX + "accepted_length",
            "Drafted tokens accepted per speculative step.",
            buckets=list(range(0, max(1, max_accepted) + 1)),
            registry=reg,
        )
        self._gauges(slots)

    def _gauges(self, slots: int) -> None:
        reg = self.registry
        Gauge(PREFIX + "parallel_slots", "Generations the model runs at once (--parallel).", registry=reg).set(slots)
        gauges = (
            ("requests_in_flight", "Admitted requests: waiting or generating.", lambda: self._in_flight),
            ("requests_processing", "Generations running now (from their first speculative step).", self._running),
            ("requests_deferred", "Admitted requests waiting for the model (the queue depth).", self._waiting),
        )
        for name, help_, read in gauges:
            Gauge(PREFIX + name, help_, registry=reg).set_function(read)
        for name, help_, num, den in _RATIOS:
            Gauge(PREFIX + name, help_, registry=reg).set_function(self._ratio(num, den))

    # -- updates -------------------------------------------------------------

    def request(self, endpoint: str) -> None:
        """Count one request.

        Args:
            endpoint: The endpoint's label in ``requests_total{endpoint=...}``.
        """
        self._requests.labels(endpoint=endpoint).inc()

    def event(self, name: str) -> None:
        """Count one ``requests_cancelled``, ``requests_failed`` or ``requests_rejected``."""
        self._events[name].inc()

    def admitted(self, n: int) -> None:
        """+1 when a request is admitted, -1 when it is done."""
        with self._lock:
            self._in_flight += n

    def processing(self, n: int) -> None:
        """+1 when a generation makes its first step, -1 when it ends."""
        with self._lock:
            self._processing += n

    def generation(self, timings: Timings, speculative: SpeculativeStats | None = None) -> None:
        """Count one finished generation from its response's ``timings`` and ``speculative``."""
        row: Mapping[str, Any] = timings
        with self._lock:
            for field, scale, counter in self._counters:
                counter.inc(float(row[field]) * scale)
                self._sums[field] += float(row[field])
            n_prompt = float(row["prompt_n"]) + float(row["cache_n"])
            self._sums["n_tokens_max"] = max(self._sums["n_tokens_max"], n_prompt + float(row["predicted_n"]))
            self._sums["n_decode"] += float(row["n_steps"]) + (1.0 if row["prompt_n"] else 0.0)
            sources = speculative["draft_sources"] if speculative else {}
            self._sums["n_drafts"] += sum(float(t["n_drafts"]) for t in sources.values())
            for n in speculative["accepted_lengths"] if speculative else []:
                self._accepted.observe(n)
            for source, t in sources.items():
                for field, counter in self._by_source.items():
                    counter.labels(source=source).inc(t[field])  # type: ignore[literal-required]
        if timings["cache_n"] > 0:
            self.event("prompt_cache_hits")

    # -- exposition ------------------------------------------------------------

    def render(self) -> bytes:
        """Every metric in Prometheus' text format (the body of ``GET /metrics``):
        llama-server's ``llamacpp:`` names first, then pydflash's."""
        return self._llamacpp().encode() + generate_latest(self.registry)

    def _llamacpp(self) -> str:
        with self._lock:
            sums = dict(self._sums)
            processing, in_flight = self._processing, self._in_flight
        p_s, g_s = sums["prompt_ms"] / 1e3, sums["predicted_ms"] / 1e3
        values = {
            **sums,
            "prompt_s": p_s,
            "predicted_s": g_s,
            "prompt_tps": sums["prompt_n"] / p_s if p_s else 0.0,
            "predicted_tps": sums["predicted_n"] / g_s if g_s else 0.0,
            "processing": float(processing),
            "deferred": float(in_flight - processing),
            "busy_per_decode": 1.0 if sums["n_decode"] else 0.0,
        }
        out = []
        for name, kind, help_, key in _LLAMACPP:
            value = float(values[key])
            out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value!r}\n")
        return "".join(out)

    def _running(self) -> float:
        with self._lock:
            return self._processing

    def _waiting(self) -> float:
        with self._lock:
            return self._in_flight - self._processing

    def _ratio(self, num: str, den: str) -> Callable[[], float]:
        def read() -> float:
            with self._lock:
                d = self._sums[den] / (1e3 if den in _MS else 1.0)
                return self._sums[num] / d if d else 0.0

        return read
