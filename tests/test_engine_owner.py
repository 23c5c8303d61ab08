"""The engine is the core pair's only owner (issue #61): a slot's tokens, save, load and
erase, the memory report and interrupt go through its named methods, each under the
rules ``Llama`` took before (a hold keeps generations off the slot; a busy slot refuses);
and a ``Generation`` runs a ``Request`` its caller built (``make_request``)."""

from __future__ import annotations

import pytest

from pydflash import Llama, PyDFlashError, SlotBusyError
from pydflash.config import SamplingConfig
from pydflash.engine.generation import Generation
from pydflash.engine.request import make_request

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


@pytest.fixture(scope="module")
def llm(model_dir, target_path):
    with Llama(target_path, draft=model_dir / "drafter-b8.gguf", n_ctx=512 * 2, n_parallel=2) as llm:
        yield llm


def test_slot_methods_round_trip_through_the_engine(llm, tmp_path):
    engine = llm._engine
    res = llm.submit(PROMPT, max_tokens=8, ignore_eos=True, slot=1).result()
    held = engine.slot_tokens(1)
    assert held[: len(PROMPT)] == PROMPT and len(held) == llm.slots()[1]["n_tokens"]
    path = str(tmp_path / "slot.bin")
    engine.save_slot(1, path)
    engine.load_slot(0, path)
    assert engine.slot_tokens(0) == held
    assert engine.erase_slot(0) == len(held) and engine.slot_tokens(0) == []
    assert llm.erase_slot(1) == len(held) and engine.slot_tokens(1) == []
    assert res.finish_reason == "length"


def test_a_hold_keeps_generations_and_other_holds_off_its_slot(llm, tmp_path):
    engine = llm._engine
    with engine.hold(0) as slot:
        assert slot.seq == 0 and slot.pair.seq == 0 and engine.busy_slots() == {0}
        with pytest.raises(SlotBusyError, match="slot 0 is busy"):
            engine.erase_slot(0)
        with pytest.raises(SlotBusyError, match="slot 0 is busy"):
            llm.save_slot(0, tmp_path / "x.bin")
        # a generation pinned to the held slot waits; one on any slot takes the other
        other = llm.submit(PROMPT, max_tokens=4, ignore_eos=True).result()
        assert other.finish_reason == "length"
        pinned = llm.submit(PROMPT, max_tokens=4, ignore_eos=True, slot=0)
        assert not pinned._gen._handle.admitted
    assert pinned.result().finish_reason == "length"
    with pytest.raises(PyDFlashError, match="no longer held"):
        slot.tokens()  # outside its block: the slot may be a generation's again


def test_the_memory_report_comes_from_the_engine(llm):
    report = llm.memory()
    assert report == llm._engine.memory() and report.n_parallel == 2 and report.rows


def test_a_generation_runs_the_request_its_caller_built(llm):
    cfg = SamplingConfig(max_tokens=5, ignore_eos=True)
    request = make_request(llm.prompt_tokens(PROMPT), cfg, llm.pair, llm.config, slot=1)
    gen = Generation(llm, request)
    assert gen.request is request and gen.slot == 1 and gen.prompt == PROMPT
    gen.wait()
    assert gen.result().tokens == llm.generate(PROMPT, max_tokens=5, ignore_eos=True).tokens
    with pytest.raises(TypeError, match="Request"):
        Generation(llm, PROMPT)  # type: ignore[arg-type]


def test_a_closed_engine_refuses_holds_and_ignores_interrupt(model_dir, target_path):
    llm = Llama(target_path, n_ctx=256)
    engine = llm._engine
    llm.close()
    assert engine.closed and llm.closed
    llm.interrupt()
    with pytest.raises(PyDFlashError, match="closed"):
        engine.save_slot(0, "unused")
    with pytest.raises(PyDFlashError, match="closed"):
        llm.memory()
