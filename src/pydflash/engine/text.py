"""Incremental detokenization and stop-string handling, shared by generate
and stream so both yield the same text."""

from __future__ import annotations

import codecs
from bisect import bisect_right
from collections.abc import Callable, Sequence


class TextAssembler:
    """Accumulates token pieces (bytes) and releases text that is final: whole
    UTF-8 characters only, and never a tail that could begin a stop string.

    Stop strings are matched in the text as the user gets it (invalid bytes
    as U+FFFD). Work per token does not grow with the length so far: only
    bytes not yet released are decoded and searched, which is enough because
    release holds back any tail that may begin a stop string."""

    def __init__(self, piece: Callable[[int], bytes], stop: Sequence[str]):
        self._piece = piece
        self._stop = [s for s in stop if s]
        self._buf = bytearray()
        self._ends: list[int] = []  # byte offset after each token
        self._sent = 0  # bytes already released as text
        self._released = 0  # tokens already released
        self.stopped = False

    @property
    def stop_strings(self) -> list[str]:
        return self._stop

    def add(self, token: int) -> None:
        self._buf += self._piece(token)
        self._ends.append(len(self._buf))

    def find_stop(self, final: bool = False) -> int | None:
        """Number of tokens to keep if a stop string has appeared in the text,
        else None. The text is cut where the earliest stop string begins.
        ``final``: no more tokens come, so an incomplete UTF-8 tail counts
        (as U+FFFD, as the final text shows it)."""
        end = len(self._buf) if final else _complete_len(self._buf)
        tail = bytes(self._buf[self._sent : end])
        text = tail.decode("utf-8", errors="replace")
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        if not hits:
            return None
        cut = self._sent + _byte_offset(tail, text, min(hits))
        keep = bisect_right(self._ends, cut)
        self.stopped = True
        del self._buf[cut:]
        del self._ends[keep:]
        return keep

    def release(self, final: bool) -> tuple[str, int]:
        """Text that became final since the last call, and how many more
        tokens are now wholly inside released text."""
        end = len(self._buf) if final else _complete_len(self._buf)
        tail = bytes(self._buf[self._sent : end])
        text = tail.decode("utf-8", errors="replace")
        if not final and not self.stopped:
            # hold back the longest tail that may still grow into a stop string
            hold = 0
            for s in self._stop:
                for k in range(min(len(s) - 1, len(text)), hold, -1):
                    if text.endswith(s[:k]):
                        hold = k
                        break
            if hold:
                end = self._sent + _byte_offset(tail, text, len(text) - hold)
                text = text[:-hold]
        self._sent = end
        n_tok = len(self._ends) if final else bisect_right(self._ends, end)
        newly = n_tok - self._released
        self._released = n_tok
        return text, newly

    def text(self) -> str:
        return self._buf.decode("utf-8", errors="replace")


def _byte_offset(b: bytes, text: str, i: int) -> int:
    """Where character ``i`` of ``text`` (``b`` decoded with errors="replace")
    begins in ``b``. A U+FFFD may stand for 1-3 invalid bytes: walk those."""
    if "\ufffd" not in text[:i]:
        return len(text[:i].encode("utf-8"))
    return _char_starts(b)[i] if i < len(text) else len(b)


def _char_starts(b: bytes) -> list[int]:
    """The byte offset at which each character of b.decode("utf-8", "replace")
    begins, from the incremental decoder's own grouping of invalid bytes."""
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    starts: list[int] = []
    done = 0  # bytes that emitted characters stand for
    for i in range(len(b)):
        out = dec.decode(b[i : i + 1])
        if out:
            # a second character is this byte's own: the first was a U+FFFD
            # for the pending bytes that this byte showed to be invalid
            starts += [done] if len(out) == 1 else [done, i]
            done = i + 1 - len(dec.getstate()[0])
    if dec.decode(b"", final=True):
        starts.append(done)
    return starts


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
