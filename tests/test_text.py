"""TextAssembler (stream text, stop strings) against a reference that decodes
the whole buffer at every step, on random token streams."""

from __future__ import annotations

import random

import pytest

from pydflash.engine.text import TextAssembler, _char_starts, _complete_len

PIECES = [w.encode() for w in ["the", " ", "a", "b", "ab", "</", "s", ">", "\n", "\n\n", "é", "漢字", "🙂", "x", "</s>"]]
# multi-byte characters split over tokens (é, 🙂, 漢), and bytes that are never valid UTF-8
SPLIT = [[b"\xc3", b"\xa9"], [b"\xf0\x9f", b"\x99", b"\x82"], [b"\xe6", b"\xbc\xa2"]]
INVALID = [b"\xff", b"\xa9", b"\xe4\xbd", b"\xc3(", b"\xf0\x9f\x99"]
STOPS = [(), ("</s>",), ("\n\n", "ab"), ("aab", "é漢"), ("🙂x",)]
# the text as the user sees it has U+FFFD for invalid bytes; stop strings match that
INVALID_STOPS = STOPS + [("\ufffd",), ("a\ufffd", "\ufffd\ufffd"), ("s>\ufffd",)]


class Reference:
    """The obvious version: decode everything at every step (quadratic)."""

    def __init__(self, piece, stop):
        self.piece, self.stop = piece, [s for s in stop if s]
        self.buf, self.ends, self.emitted, self.released, self.stopped = b"", [], 0, 0, False

    def add(self, t):
        self.buf += self.piece(t)
        self.ends.append(len(self.buf))

    def find_stop(self, final=False):
        text = self.buf[: len(self.buf) if final else _complete_len(self.buf)].decode()
        hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if not hits:
            return None
        cut = len(text[: min(hits)].encode())
        keep = sum(1 for e in self.ends if e <= cut)
        self.stopped, self.buf, self.ends = True, self.buf[:cut], self.ends[:keep]
        return keep

    def release(self, final):
        text = self.buf.decode() if final else self.buf[: _complete_len(self.buf)].decode()
        limit = len(text)
        if not final and not self.stopped:
            for s in self.stop:
                for k in range(min(len(s) - 1, len(text)), 0, -1):
                    if text.endswith(s[:k]):
                        limit = min(limit, len(text) - k)
                        break
        out = text[self.emitted:limit]
        self.emitted = max(self.emitted, limit)
        done = len(text[: self.emitted].encode())
        n_tok = len(self.ends) if final else sum(1 for e in self.ends if e <= done)
        newly, self.released = n_tok - self.released, n_tok
        return out, newly


def drive(asm, tokens, steps):
    """Feed tokens in steps of the given sizes like _generation.Generation does; the events."""
    events, kept, i = [], None, 0
    stops = asm.stop_strings if isinstance(asm, TextAssembler) else asm.stop
    for n in steps:
        for t in tokens[i:i + n]:
            asm.add(t)
        i += n
        if stops:
            kept = asm.find_stop()
        events.append(asm.release(final=kept is not None))
        if kept is not None:
            break
    if kept is None:
        kept = asm.find_stop(final=True) if stops else None
        events.append(asm.release(final=True))
    return events, kept


def random_case(rng, pieces, n_whole):
    """Token ids into pieces; a split character's parts (ids from n_whole on,
    in SPLIT order) come in order."""
    tokens, groups, at = [], [], n_whole
    for g in SPLIT:
        groups.append(list(range(at, at + len(g))))
        at += len(g)
    while len(tokens) < rng.randrange(1, 80):
        tokens += rng.choice(groups) if rng.random() < 0.2 else [rng.randrange(n_whole)]
    steps, left = [], len(tokens)
    while left > 0:
        steps.append(min(left, rng.randrange(1, 6)))
        left -= steps[-1]
    return tokens, steps


@pytest.mark.parametrize("stop", STOPS, ids=repr)
def test_same_events_as_the_reference(stop):
    pieces = PIECES + [p for g in SPLIT for p in g]
    rng = random.Random(len(stop))
    for _ in range(300):
        tokens, steps = random_case(rng, pieces, len(PIECES))
        mine = drive(TextAssembler(pieces.__getitem__, stop), tokens, steps)
        ref = drive(Reference(pieces.__getitem__, stop), tokens, steps)
        assert mine == ref, (tokens, steps)


@pytest.mark.parametrize("stop", INVALID_STOPS, ids=repr)
def test_invalid_utf8_is_released_once_and_whole(stop):
    # the reference cannot take these (strict decode); check the invariants
    pieces = PIECES + INVALID + [p for g in SPLIT for p in g]
    rng = random.Random(7)
    stopped = 0
    for _ in range(300):
        tokens, steps = random_case(rng, pieces, len(PIECES) + len(INVALID))
        asm = TextAssembler(pieces.__getitem__, stop)
        events, kept = drive(asm, tokens, steps)
        text = "".join(t for t, _ in events)
        assert text == asm.text()
        assert sum(n for _, n in events) == (len(tokens) if kept is None else kept)
        assert not any(s in text for s in stop)
        if kept is not None:
            # cut where a stop string first appears in the text fed so far
            n_fed = sum(steps[: len(events)])
            fed = b"".join(pieces[t] for t in tokens[:n_fed])
            seen = fed[: len(fed) if n_fed == len(tokens) else _complete_len(fed)].decode("utf-8", errors="replace")
            assert text == seen[: min(i for i in (seen.find(s) for s in stop) if i >= 0)]
            stopped += 1
    assert stopped > 0 or not stop


def test_char_starts_of_invalid_utf8():
    rng = random.Random(3)
    alphabet = PIECES + INVALID + [p for g in SPLIT for p in g]
    for _ in range(500):
        b = b"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        text = b.decode("utf-8", errors="replace")
        starts = _char_starts(b)
        assert len(starts) == len(text)
        for i, ch in enumerate(text):
            j = starts[i + 1] if i + 1 < len(text) else len(b)
            assert b[starts[i]:j].decode("utf-8", errors="replace") == ch, (b, i)


def test_a_stop_string_split_over_steps_is_found_and_never_released():
    asm = TextAssembler([b"x<", b"/", b"s", b">tail"].__getitem__, ["</s>"])
    out = []
    for t in range(4):
        asm.add(t)
        kept = asm.find_stop()
        out.append(asm.release(final=kept is not None))
    # the text ends where the stop string begins; the token that held its
    # first byte is not kept
    assert out == [("x", 0), ("", 0), ("", 0), ("", 0)]
    assert kept == 0 and asm.text() == "x"
