"""The serving bench's HTTP client: one streaming ``/v1/completions`` request,
the arrival time of each server-sent event, and from them time to first
token, inter-token latency and tokens/s. Every engine is driven by this same
code (the standard library's http.client: no client library's overhead in
the figures)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Chunk = dict[str, Any]  # one event's JSON object

# A queued request may wait for every request ahead of it before its first byte.
TIMEOUT_S = 1800.0


class ServingError(RuntimeError):
    """A server refused a request or broke off its stream."""


@dataclasses.dataclass
class Delivery:
    """Tokens that arrived together."""

    t_s: float  # arrival, seconds after the request was sent
    n_tokens: int
    text: str


@dataclasses.dataclass
class StreamRecord:
    """One streamed completion as the client saw it."""

    t_sent: float  # time.perf_counter() when the request was sent
    t_done: float  # ... when its stream ended
    deliveries: list[Delivery]
    usage: dict[str, Any]  # the final chunk's (OpenAI's token counts)
    timings: dict[str, Any]  # the final chunk's (llama-server's: cache_n, prompt_n, draft_n, ...)
    token_counts: str  # how the tokens per event were known: see token_counts()

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deliveries)

    @property
    def n_tokens(self) -> int:
        return sum(d.n_tokens for d in self.deliveries)

    @property
    def ttft_s(self) -> float:
        return self.deliveries[0].t_s if self.deliveries else self.t_done - self.t_sent

    @property
    def e2e_s(self) -> float:
        """Until the last token arrived."""
        return self.deliveries[-1].t_s if self.deliveries else self.t_done - self.t_sent

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latency, one value per token after the first delivery: a
        delivery of k tokens after a gap g gives k values of g / k (as SGLang's
        bench_serving counts a speculative step)."""
        out: list[float] = []
        for prev, d in zip(self.deliveries[:-1], self.deliveries[1:], strict=True):
            out += [(d.t_s - prev.t_s) / d.n_tokens] * d.n_tokens
        return out

    @property
    def request_tok_s(self) -> float:
        """Tokens over the request's whole latency (waiting and prefill included)."""
        return self.n_tokens / self.e2e_s if self.e2e_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first delivery over the time after it."""
        if len(self.deliveries) < 2:
            return 0.0
        span = self.deliveries[-1].t_s - self.deliveries[0].t_s
        return (self.n_tokens - self.deliveries[0].n_tokens) / span if span > 0 else 0.0


def stream_completion(
    base_url: str, body: Mapping[str, Any], timeout: float = TIMEOUT_S, on_event: Callable[[int], None] | None = None
) -> StreamRecord:
    """POST ``body`` (``stream`` is set) to ``base_url``/v1/completions and read
    its events; ``on_event(n)`` is called after the n-th event's arrival is stamped."""
    u = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=timeout)
    payload = json.dumps({**body, "stream": True}).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    raw: list[tuple[float, bytes]] = []
    try:
        t_sent = time.perf_counter()
        conn.request("POST", "/v1/completions", body=payload, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServingError(f"{base_url}: HTTP {resp.status}: {resp.read()[:500].decode(errors='replace')}")
        # the loop only stamps lines: parsing waits for the end, so it cannot delay an arrival
        while line := resp.readline():
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                raw.append((time.perf_counter(), data))
                if on_event is not None:
                    on_event(len(raw))
        t_done = time.perf_counter()
    finally:
        conn.close()
    chunks: list[Chunk] = []
    for _, data in raw:
        chunk = json.loads(data)
        if "error" in chunk:
            raise ServingError(f"{base_url}: {chunk['error']}")
        chunks.append(chunk)
    return record_from_events(t_sent, t_done, [t for t, _ in raw], chunks)


def record_from_events(t_sent: float, t_done: float, times: Sequence[float], chunks: Sequence[Chunk]) -> StreamRecord:
    """A record from the events' arrival times (perf_counter) and objects.

    A delivery is one speculative step's tokens, counted from the arrival of
    its first event: pydflash sends a step (or a run of plain steps) as one
    event; llama-server sends a token per event, and with ``timings_per_token``
    the events of one step carry the same ``timings.predicted_ms`` (its clock
    is read once a step)."""
    if not chunks:
        raise ServingError("the stream ended without an event")
    counts, how = token_counts(chunks)
    final = chunks[-1]
    deliveries: list[Delivery] = []
    last_step: object = None
    for t, n, chunk in zip(times, counts, chunks, strict=True):
        text = _text(chunk)
        if n == 0 and not text:
            continue
        step = (chunk.get("timings") or {}).get("predicted_ms") if how == "server" else None
        if deliveries and (n == 0 or (step is not None and step == last_step)):
            deliveries[-1].n_tokens += n
            deliveries[-1].text += text
        else:
            deliveries.append(Delivery(t - t_sent, n, text))
        last_step = step
    return StreamRecord(
        t_sent=t_sent,
        t_done=t_done,
        deliveries=deliveries,
        usage=dict(final.get("usage") or {}),
        timings=dict(final.get("timings") or {}),
        token_counts=how,
    )


def token_counts(chunks: Sequence[Chunk]) -> tuple[list[int], str]:
    """Tokens each event carries, and how that was known:

    - "server": every event with text has ``timings.predicted_n``, the tokens
      generated so far (llama-server with ``timings_per_token``);
    - "steps": the final event's ``speculative.accepted_lengths`` has one entry per
      event with text (pydflash: an event per speculative step, whose tokens are
      its accepted drafts + 1, where no run of plain steps came as one event);
    - "even": neither holds (text held back across a step): the completion's
      tokens spread evenly over the events with text."""
    texts = [_text(c) for c in chunks]
    final_timings = chunks[-1].get("timings") or {}
    total = int((chunks[-1].get("usage") or {}).get("completion_tokens", final_timings.get("predicted_n", 0)))
    done = [(c.get("timings") or {}).get("predicted_n") for c in chunks]
    if any(texts) and all(n is not None for n, t in zip(done, texts, strict=True) if t):
        counts, seen = [], 0
        for n in done:
            counts.append(max(int(n) - seen, 0) if n is not None else 0)
            seen = max(seen, int(n) if n is not None else 0)
        return counts, "server"
    with_text = [i for i, t in enumerate(texts) if t]
    lengths = (chunks[-1].get("speculative") or {}).get("accepted_lengths")
    counts = [0] * len(chunks)
    if isinstance(lengths, list) and len(lengths) == len(with_text):
        left = total
        for i, accepted in zip(with_text, lengths, strict=True):
            counts[i] = min(int(accepted) + 1, left)
            left -= counts[i]
        if left == 0:
            return counts, "steps"
    n = len(with_text)
    for j, i in enumerate(with_text):
        counts[i] = total * (j + 1) // n - total * j // n
    return counts, "even"


def _text(chunk: Chunk) -> str:
    choices = chunk.get("choices") or [{}]
    return str(choices[0].get("text") or "")
