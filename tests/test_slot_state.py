"""A sequence slot saved to disk and loaded back, into this pair or another on
the same files: the next turn takes the saved tokens from the cache, and its
output and per-step accepted drafts equal a fresh prefill's (the drafter's
features came back too). Mismatched or damaged files are refused with
ValueError before the slot is touched."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from pydflash import Llama, PyDFlashError, SlotBusyError, embedded_pair
from support.pairs import PAIRS, THREADS

TURN1 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5] * 4
NEW = [8, 9, 7, 9]


def open_pair(target: Path, draft: Path, **kw) -> Llama:
    # accepted counts are compared with a fresh prefill's: fixed draft lengths
    kw.setdefault("draft_adaptive", False)
    return Llama(target, draft=draft, n_ctx=512 * 2, n_parallel=2, n_threads=THREADS, **kw)


def check_round_trip(target: Path, draft: Path, tmp_path: Path, turn1: list[int] = TURN1, **kw) -> None:
    path = tmp_path / "slot.bin"
    with open_pair(target, draft, **kw) as a:
        first = a.submit(turn1, max_tokens=24, ignore_eos=True, slot=0).result()
        a.save_slot(0, path)
    turn2 = turn1 + first.tokens + NEW
    with open_pair(target, draft, **kw) as b:
        b.load_slot(1, path)
        again = b.submit(turn2, max_tokens=20, ignore_eos=True, slot=1).result()
        fresh = b.submit(turn2, max_tokens=20, ignore_eos=True, slot=0, cache_prompt=False).result()
    assert again.stats.cached_tokens == len(turn1) + len(first.tokens) - 1  # all but the pending token
    assert again.tokens == fresh.tokens
    assert [s.n_accepted for s in again.stats.steps] == [s.n_accepted for s in fresh.stats.steps]


def test_a_slot_round_trips_through_a_file(target_path, model_dir, tmp_path):
    check_round_trip(target_path, model_dir / "drafter-b8.gguf", tmp_path)


def test_the_embedded_pair_round_trips(tmp_path):
    # a trained drafter: without its saved features it would accept fewer drafts
    target, draft = embedded_pair()
    with Llama(target, n_ctx=256) as llm:
        turn1 = llm.tokenize("import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n")
    check_round_trip(Path(target), Path(draft), tmp_path, turn1)


@pytest.mark.parametrize("name", ["qwen35-b8", "qwen3next-b8"])
def test_a_hybrid_targets_recurrent_state_round_trips(hybrid_models, tmp_path, name):
    arch, drafter, rollback, _ = PAIRS[name]
    check_round_trip(hybrid_models / f"{arch}-target.gguf", hybrid_models / f"{arch}-drafter-{drafter}.gguf",
                     tmp_path, rollback=rollback)


def test_bad_files_are_refused_and_the_slot_stays_usable(target_path, model_dir, tmp_path):
    good = tmp_path / "slot.bin"
    with open_pair(target_path, model_dir / "drafter-b8.gguf") as a:
        a.submit(TURN1, max_tokens=8, ignore_eos=True, slot=0).result()
        a.save_slot(0, good)
    data = good.read_bytes()
    (tmp_path / "short.bin").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.bin").write_bytes(b"not a slot at all")
    cases = {
        "short.bin": "truncated",
        "junk.bin": "not a pydflash slot file",
        "missing.bin": "no such slot file",
    }
    with open_pair(target_path, model_dir / "drafter-b8.gguf") as b:
        want = b.generate([1, 2, 3], max_tokens=10, ignore_eos=True).tokens
        held = b.pair.sequence(1).tokens
        for name, msg in cases.items():
            with pytest.raises(ValueError, match=msg):
                b.load_slot(1, tmp_path / name)
            assert b.pair.sequence(1).tokens == held  # untouched
            assert b.submit([1, 2, 3], max_tokens=10, ignore_eos=True, slot=1).result().tokens == want
            held = b.pair.sequence(1).tokens
    # other model files: the fingerprint names both
    with open_pair(target_path, model_dir / "drafter-b16.gguf") as c:
        with pytest.raises(ValueError, match="saved from other models"):
            c.load_slot(0, good)
    with Llama(target_path, n_ctx=1024) as alone:
        with pytest.raises(ValueError, match="drafter: none"):
            alone.load_slot(0, good)


def test_a_busy_slot_and_bad_slot_numbers(target_path, model_dir, tmp_path):
    with open_pair(target_path, model_dir / "drafter-b8.gguf") as llm:
        sub = llm.submit([5, 6, 7], max_tokens=200, ignore_eos=True, slot=0)
        next(iter(sub))
        for call in (lambda: llm.save_slot(0, tmp_path / "x.bin"), lambda: llm.load_slot(0, tmp_path / "x.bin"),
                     lambda: llm.erase_slot(0)):
            with pytest.raises(SlotBusyError, match="slot 0 is busy"):
                call()
        assert issubclass(SlotBusyError, PyDFlashError)
        sub.cancel()
        for bad in (-1, 2, True):
            with pytest.raises(ValueError, match="slot must be"):
                llm.save_slot(bad, tmp_path / "x.bin")


def _post(url: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_servers_slot_endpoints(target_path, model_dir, tmp_path):
    from pydflash.server import Server

    with open_pair(target_path, model_dir / "drafter-b8.gguf") as llm, \
            Server(llm, port=0, slot_save_path=tmp_path) as srv:
        first = llm.submit(TURN1, max_tokens=12, ignore_eos=True, slot=0).result()
        with urllib.request.urlopen(srv.url + "/slots", timeout=60) as r:
            slots = json.loads(r.read())
        assert [s["n_tokens"] for s in slots] == [len(TURN1) + 12, 0] and not slots[0]["is_processing"]
        status, saved = _post(srv.url + "/slots/0?action=save", {"filename": "conv.bin"})
        assert status == 200 and saved["n_saved"] == len(TURN1) + 12 and (tmp_path / "conv.bin").is_file()
        status, restored = _post(srv.url + "/slots/1?action=restore", {"filename": "conv.bin"})
        assert status == 200 and restored["n_restored"] == len(TURN1) + 12
        turn2 = TURN1 + first.tokens + NEW
        again = llm.submit(turn2, max_tokens=8, ignore_eos=True, slot=1).result()
        assert again.stats.cached_tokens == len(TURN1) + len(first.tokens) - 1
        assert _post(srv.url + "/slots/0?action=erase")[1] == {"id_slot": 0, "n_erased": len(TURN1) + 12}
        # refused: a path, a missing file, an unknown slot or action
        assert _post(srv.url + "/slots/0?action=save", {"filename": "../x.bin"})[0] == 400
        status, err = _post(srv.url + "/slots/0?action=restore", {"filename": "none.bin"})
        assert status == 400 and "no such slot file" in err["error"]["message"]
        assert _post(srv.url + "/slots/5?action=save", {"filename": "a.bin"})[0] == 400
        assert _post(srv.url + "/slots/0?action=fly")[0] == 400
    with open_pair(target_path, model_dir / "drafter-b8.gguf") as llm, Server(llm, port=0) as srv:
        status, err = _post(srv.url + "/slots/0?action=save", {"filename": "a.bin"})
        assert status == 501 and "--slot-save-path" in err["error"]["message"]
