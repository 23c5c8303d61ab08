"""Incremental detokenization and stop-string handling, shared by generate
and stream so both yield the same text."""

from __future__ import annotations

from typing import Callable, Sequence


class TextAssembler:
    """Accumulates token pieces (bytes) and releases text that is final: whole
    UTF-8 characters only, and never a tail that could begin a stop string."""

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str]):
        self._piece = piece
        self._stop = [s for s in stop if s]
        self._buf = bytearray()
        self._ends: list[int] = []  # byte offset after each token
        self._emitted = 0           # characters of text already released
        self._released = 0          # tokens already released
        self.stopped = False

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    def add(self, token: int) -> None:
        self._buf += self._piece(token)
        self._ends.append(len(self._buf))

    def _decoded(self) -> str:
        # leave out an incomplete UTF-8 tail (a character split across tokens)
        return bytes(self._buf[: _complete_len(self._buf)]).decode("utf-8", errors="replace")

    def find_stop(self) -> int | None:
        """Number of tokens to keep if a stop string has appeared, else None."""
        text = self._decoded()
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if not hits:
            return None
        cut_chars = min(hits)
        cut_bytes = len(text[:cut_chars].encode("utf-8"))
        keep = sum(1 for e in self._ends if e <= cut_bytes)
        self.stopped = True
        self._buf = self._buf[:cut_bytes]
        self._ends = self._ends[:keep]
        return keep

    def release(self, final: bool) -> tuple[str, int]:
        """Text that became final since the last call, and how many more
        tokens are now wholly inside released text."""
        text = self._buf.decode("utf-8", errors="replace") if final else self._decoded()
        limit = len(text)
        if not final and not self.stopped:
            # hold back a tail that may still grow into a stop string
            for s in self._stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        limit = min(limit, len(text) - k)
                        break
        out = text[self._emitted:limit]
        self._emitted = max(self._emitted, limit)
        if final:
            n_tok = len(self._ends)
        else:
            done = len(text[: self._emitted].encode("utf-8"))
            n_tok = sum(1 for e in self._ends if e <= done)
        newly = n_tok - self._released
        self._released = n_tok
        return out, newly

    def text(self) -> str:
        return self._buf.decode("utf-8", errors="replace")


def _complete_len(b: bytes | bytearray) -> int:
    """Length of ``b`` without a trailing, still incomplete UTF-8 sequence."""
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c & 0xC0 == 0x80:  # continuation byte: look further back
            continue
        need = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 1
        return n - back if need > back else n
    return n
